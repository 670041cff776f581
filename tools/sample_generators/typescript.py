"""TypeScript samples: task instruction -> code, over the entities and utility types of
typescript_entities.py."""

from __future__ import annotations

import re
from random import Random

from sample_generators.common import cap
from sample_generators.typescript_entities import TS_ENTITY_LIST, TS_UTILITIES, TsEntity, TsField


def camel(*words: str) -> str:
    first, *rest = words
    return first[0].lower() + first[1:] + "".join(w[0].upper() + w[1:] for w in rest)


def ts_interface(rng, e):
    fields = [e.id] + rng.sample(e.fields[1:], rng.randint(2, len(e.fields) - 1))
    fields.sort(key=e.fields.index)
    readonly = rng.random() < 0.3
    described = ", ".join(f"`{f.name}` ({'optional ' if f.optional else ''}{f.type.replace(chr(34), chr(39))})" for f in fields)
    instr = rng.choice([f"Define a TypeScript interface `{e.name}` with the fields {described}.",
                        f"Write an exported interface named {e.name} describing an object with: {described}."])
    if readonly:
        instr += f" Make `{e.id.name}` readonly."
    code = e.interface(fields)
    if readonly:
        code = code.replace(f"  {e.id.name}:", f"  readonly {e.id.name}:", 1)
    return instr, code


def ts_filter(rng, e):
    f = rng.choice(e.of("boolean", "union", "string", "number", required=True)[1:] or e.fields[1:2])
    name = camel("filter", e.plural, "by", f.name)
    if f.base == "number":
        instr = f"Write a typed function `{name}` that returns the {e.plural.lower()} whose `{f.name}` is between `min` and `max` (inclusive), without mutating the input."
        code = (f"{e.interface()}\n\nexport function {name}(items: readonly {e.name}[], min: number, max: number): {e.name}[] {{\n"
                f"  return items.filter((item) => item.{f.name} >= min && item.{f.name} <= max);\n}}")
    else:
        param = f'{e.name}["{f.name}"]' if f.base == "union" else f.type
        instr = f"Write a function `{name}(items, {f.name})` that keeps only the {e.name} objects with the given `{f.name}`. Use precise parameter types."
        code = (f"{e.interface()}\n\nexport function {name}(items: readonly {e.name}[], {f.name}: {param}): {e.name}[] {{\n"
                f"  return items.filter((item) => item.{f.name} === {f.name});\n}}")
    return instr, code


def ts_aggregate(rng, e):
    nums = e.of("number", required=True)
    nums = [n for n in nums if n is not e.id] or nums
    if not nums:
        return None
    f = rng.choice(nums)
    kind = rng.choice(["sum", "average", "max"])
    name = camel(kind, f.name)
    if kind == "sum":
        body = f"  return items.reduce((total, item) => total + item.{f.name}, 0);"
        ret = "number"
    elif kind == "average":
        body = (f"  if (items.length === 0) {{\n    return 0;\n  }}\n"
                f"  const total = items.reduce((sum, item) => sum + item.{f.name}, 0);\n  return total / items.length;")
        ret = "number"
    else:
        body = (f"  let best: {e.name} | undefined;\n  for (const item of items) {{\n"
                f"    if (best === undefined || item.{f.name} > best.{f.name}) {{\n      best = item;\n    }}\n  }}\n  return best;")
        ret = f"{e.name} | undefined"
    what = {"sum": f"the sum of `{f.name}`", "average": f"the average `{f.name}` (0 for an empty list)",
            "max": f"the {e.name} with the largest `{f.name}` (or undefined for an empty list)"}[kind]
    instr = f"Implement `{name}(items: {e.name}[])` in TypeScript returning {what} over a list of {e.plural.lower()}."
    return instr, f"{e.interface()}\n\nexport function {name}(items: readonly {e.name}[]): {ret} {{\n{body}\n}}"


def ts_group(rng, e):
    keys = e.of("union", "boolean", "string", required=True)[1:]
    if not keys:
        return None
    f = rng.choice(keys)
    name = camel("group", e.plural, "by", f.name)
    if rng.random() < 0.5:
        key_type = f'{e.name}["{f.name}"]' if f.base == "union" else "string"
        record = f"Partial<Record<{key_type}, {e.name}[]>>" if f.base == "union" else f"Record<string, {e.name}[]>"
        key_expr = f"String(item.{f.name})" if f.base == "boolean" else f"item.{f.name}"
        code = (f"{e.interface()}\n\nexport function {name}(items: readonly {e.name}[]): {record} {{\n"
                f"  const groups: {record} = {{}};\n  for (const item of items) {{\n    const key = {key_expr};\n"
                f"    (groups[key] ??= []).push(item);\n  }}\n  return groups;\n}}")
        instr = f"Write `{name}`, which groups {e.plural.lower()} by their `{f.name}` into a plain object, fully typed."
    else:
        key_type = f.type if f.base in ("string", "boolean") else f'{e.name}["{f.name}"]'
        code = (f"{e.interface()}\n\nexport function {name}(items: Iterable<{e.name}>): Map<{key_type}, {e.name}[]> {{\n"
                f"  const groups = new Map<{key_type}, {e.name}[]>();\n  for (const item of items) {{\n"
                f"    const bucket = groups.get(item.{f.name});\n    if (bucket) {{\n      bucket.push(item);\n    }} else {{\n"
                f"      groups.set(item.{f.name}, [item]);\n    }}\n  }}\n  return groups;\n}}")
        instr = f"Group an iterable of {e.name} by `{f.name}` and return a `Map`. Name the function `{name}` and type it precisely."
    return instr, code


def ts_sort(rng, e):
    f = rng.choice(e.of("number", "string", "Date", required=True))
    desc = rng.random() < 0.5
    name = camel("sort", e.plural, "by", f.name)
    a, b = ("b", "a") if desc else ("a", "b")
    compare = {"number": f"{a}.{f.name} - {b}.{f.name}", "string": f"{a}.{f.name}.localeCompare({b}.{f.name})",
               "Date": f"{a}.{f.name}.getTime() - {b}.{f.name}.getTime()"}[f.base]
    instr = f"Write `{name}` that returns a new array of {e.plural.lower()} sorted by `{f.name}` in {'descending' if desc else 'ascending'} order; do not mutate the argument."
    return instr, (f"{e.interface()}\n\nexport function {name}(items: readonly {e.name}[]): {e.name}[] {{\n"
                   f"  return [...items].sort((a, b) => {compare});\n}}")


def ts_check(f: TsField, target: str) -> str:
    access = f"{target}.{f.name}"
    if f.base in ("string", "number", "boolean"):
        check = f'typeof {access} === "{f.base}"'
    elif f.base == "Date":
        check = f"{access} instanceof Date"
    elif f.base == "array":
        check = f'Array.isArray({access}) && {access}.every((x) => typeof x === "{f.type[:-2]}")'
    else:
        options = [o.strip() for o in f.type.split("|")]
        check = f"[{', '.join(options)}].includes({access} as string)"
    return f"({access} === undefined || {check})" if f.optional else check


def ts_guard(rng, e):
    name = f"is{e.name}"
    checks = "\n    && ".join(ts_check(f, "v") for f in e.fields)
    instr = rng.choice([f"Write a type guard `{name}(value: unknown): value is {e.name}` that validates every field at runtime.",
                        f"I receive untyped JSON. Implement a TypeScript user-defined type guard for the {e.name} interface below.\n\n{e.interface(export=False)}"])
    code = (f"{e.interface()}\n\nexport function {name}(value: unknown): value is {e.name} {{\n"
            f"  if (typeof value !== \"object\" || value === null) {{\n    return false;\n  }}\n"
            f"  const v = value as Record<string, unknown>;\n  return {checks};\n}}")
    return instr, code


def ts_fetch(rng, e):
    path = "/api/" + re.sub(r"(?<!^)(?=[A-Z])", "-", e.plural).lower()
    dates = e.of("Date")
    if rng.random() < 0.5:
        name = camel("fetch", e.name)
        revive = "".join(f"\n    {f.name}: {'data.' + f.name + ' === undefined ? undefined : ' if f.optional else ''}new Date(data.{f.name}),"
                         for f in dates)
        ret = "{\n    ...data," + revive + "\n  }" if dates else "data"
        raw = f"Omit<{e.name}, {' | '.join(repr(f.name).replace(chr(39), chr(34)) for f in dates)}> & Record<{' | '.join(repr(f.name).replace(chr(39), chr(34)) for f in dates)}, string>" if dates else e.name
        instr = f"Write an async function `{name}(baseUrl, {e.id.name})` that GETs `{path}/:{e.id.name}`, throws an `HttpError` with the status on a non-2xx response, and returns a typed {e.name}" + (" with date strings converted to Date objects." if dates else ".")
        code = (f"{e.interface()}\n\nexport class HttpError extends Error {{\n  constructor(public readonly status: number, message: string) {{\n"
                f"    super(message);\n    this.name = \"HttpError\";\n  }}\n}}\n\n"
                f"export async function {name}(baseUrl: string, {e.id.name}: {e.id.type}, init?: RequestInit): Promise<{e.name}> {{\n"
                f"  const response = await fetch(`${{baseUrl}}{path}/${{encodeURIComponent(String({e.id.name}))}}`, init);\n"
                f"  if (!response.ok) {{\n    throw new HttpError(response.status, `GET {path} failed: ${{response.statusText}}`);\n  }}\n"
                f"  const data = (await response.json()) as {raw};\n  return {ret};\n}}")
        return instr, code
    name = camel("list", e.plural)
    filters = rng.sample(e.of("string", "union", "boolean", "number", required=True)[1:], k=min(2, len(e.of("string", "union", "boolean", "number", required=True)[1:])))
    params = "".join(f"\n  {f.name}?: {f.type};" for f in filters)
    instr = (f"Create a typed fetch wrapper `{name}` for `GET {path}` that accepts optional query filters "
             f"({', '.join(f.name for f in filters) or 'none'}) plus `page` and `pageSize`, aborts after a timeout, and returns `Page<{e.name}>`.")
    code = (f"{e.interface()}\n\nexport interface Page<T> {{\n  items: T[];\n  total: number;\n  page: number;\n}}\n\n"
            f"export interface {e.name}Query {{{params}\n  page?: number;\n  pageSize?: number;\n}}\n\n"
            f"export async function {name}(baseUrl: string, query: {e.name}Query = {{}}, timeoutMs = {rng.choice([3000, 5000, 10000])}): Promise<Page<{e.name}>> {{\n"
            f"  const params = new URLSearchParams();\n  for (const [key, value] of Object.entries(query)) {{\n"
            f"    if (value !== undefined) {{\n      params.set(key, String(value));\n    }}\n  }}\n"
            f"  const controller = new AbortController();\n  const timer = setTimeout(() => controller.abort(), timeoutMs);\n"
            f"  try {{\n    const response = await fetch(`${{baseUrl}}{path}?${{params}}`, {{ signal: controller.signal }});\n"
            f"    if (!response.ok) {{\n      throw new Error(`GET {path} failed with ${{response.status}}`);\n    }}\n"
            f"    return (await response.json()) as Page<{e.name}>;\n  }} finally {{\n    clearTimeout(timer);\n  }}\n}}")
    return instr, code


def ts_utility(rng, e):
    name = rng.choice(list(TS_UTILITIES))
    what, code = TS_UTILITIES[name]
    usage_name = {"KeysOfType": f"{e.name}NumberKeys", "PickByType": f"{e.name}StringFields",
                  "RequireKeys": f"Strict{e.name}"}.get(name, f"{name}{e.name}")
    args = {"KeysOfType": f"{e.name}, number", "PickByType": f"{e.name}, string",
            "RequireKeys": f"{e.name}, {' | '.join(chr(34) + f.name + chr(34) for f in e.fields if f.optional) or chr(34) + e.id.name + chr(34)}"}.get(name, e.name)
    instr = rng.choice([f"Write a generic utility type `{name}<T>` that {what}, and use it to declare `{usage_name}` for the {e.name} interface.",
                        f"Create a TypeScript mapped type called {name} that {what}. Show it applied to {e.name}."])
    return instr, f"{e.interface()}\n\n{code}\n\nexport type {usage_name} = {name}<{args}>;"


def ts_store(rng, e):
    cls = f"{e.name}{rng.choice(['Store', 'Repository', 'Registry'])}"
    idt = e.id
    instr = (f"Implement a class `{cls}` that keeps {e.plural.lower()} in memory keyed by `{idt.name}`, with `add`, `get`, "
             f"`update` (partial patch, `{idt.name}` cannot change), `remove` and `list(predicate?)`. No frameworks.")
    code = (f"{e.interface()}\n\nexport class {cls} {{\n  private readonly items = new Map<{idt.type}, {e.name}>();\n\n"
            f"  add(item: {e.name}): void {{\n    if (this.items.has(item.{idt.name})) {{\n"
            f"      throw new Error(`{e.name} ${{item.{idt.name}}} already exists`);\n    }}\n    this.items.set(item.{idt.name}, item);\n  }}\n\n"
            f"  get({idt.name}: {idt.type}): {e.name} | undefined {{\n    return this.items.get({idt.name});\n  }}\n\n"
            f"  update({idt.name}: {idt.type}, patch: Partial<Omit<{e.name}, \"{idt.name}\">>): {e.name} {{\n"
            f"    const current = this.items.get({idt.name});\n    if (!current) {{\n      throw new Error(`{e.name} ${{{idt.name}}} not found`);\n    }}\n"
            f"    const updated = {{ ...current, ...patch }};\n    this.items.set({idt.name}, updated);\n    return updated;\n  }}\n\n"
            f"  remove({idt.name}: {idt.type}): boolean {{\n    return this.items.delete({idt.name});\n  }}\n\n"
            f"  list(predicate: (item: {e.name}) => boolean = () => true): {e.name}[] {{\n    return [...this.items.values()].filter(predicate);\n  }}\n}}")
    return instr, code


def ts_union(rng, e):
    t = e.name
    idt = e.id
    changes = rng.sample(e.fields[1:], k=min(2, len(e.fields) - 1))
    instr = (f"Model the events of a {t} lifecycle as a discriminated union `{t}Event` (created, updated with a patch, deleted) "
             f"and write a reducer `apply{t}Event(state: Map<{idt.type}, {t}>, event: {t}Event)` that returns a new Map and checks exhaustiveness with `never`.")
    code = (f"{e.interface()}\n\nexport type {t}Event =\n  | {{ type: \"created\"; {e.var}: {t} }}\n"
            f"  | {{ type: \"updated\"; {idt.name}: {idt.type}; changes: Partial<Pick<{t}, {' | '.join(chr(34) + f.name + chr(34) for f in changes)}>> }}\n"
            f"  | {{ type: \"deleted\"; {idt.name}: {idt.type} }};\n\n"
            f"export function apply{t}Event(state: Map<{idt.type}, {t}>, event: {t}Event): Map<{idt.type}, {t}> {{\n"
            f"  const next = new Map(state);\n  switch (event.type) {{\n    case \"created\":\n"
            f"      next.set(event.{e.var}.{idt.name}, event.{e.var});\n      return next;\n    case \"updated\": {{\n"
            f"      const current = next.get(event.{idt.name});\n      if (current) {{\n        next.set(event.{idt.name}, {{ ...current, ...event.changes }});\n      }}\n"
            f"      return next;\n    }}\n    case \"deleted\":\n      next.delete(event.{idt.name});\n      return next;\n"
            f"    default: {{\n      const unreachable: never = event;\n      throw new Error(`unknown event ${{JSON.stringify(unreachable)}}`);\n    }}\n  }}\n}}")
    return instr, code


def ts_fix(rng, e):
    nums = [f for f in e.of("number", required=True) if f is not e.id]
    options = (["find"] if label(e) else []) + (["reduce"] if nums else []) + (["optional"] if any(f.optional and f.base == "string" for f in e.fields) else [])
    bug = rng.choice(options + ["param"])
    idt = e.id
    if bug == "find":
        broken = (f"function get{e.name}{cap(label(e))}(items: {e.name}[], {idt.name}: {idt.type}): string {{\n"
                  f"  const found = items.find((item) => item.{idt.name} === {idt.name});\n  return found.{label(e)};\n}}")
        error = "Object is possibly 'undefined'. (TS18048)"
        fixed = (f"function get{e.name}{cap(label(e))}(items: {e.name}[], {idt.name}: {idt.type}): string | undefined {{\n"
                 f"  const found = items.find((item) => item.{idt.name} === {idt.name});\n  return found?.{label(e)};\n}}")
    elif bug == "reduce":
        f = rng.choice(nums)
        broken = f"function total{cap(f.name)}(items: {e.name}[]): number {{\n  return items.reduce((sum, item) => sum + item.{f.name});\n}}"
        error = f"Operator '+' cannot be applied to types '{e.name}' and 'number'. (TS2365)"
        fixed = f"function total{cap(f.name)}(items: {e.name}[]): number {{\n  return items.reduce((sum, item) => sum + item.{f.name}, 0);\n}}"
    elif bug == "optional":
        f = next(f for f in e.fields if f.optional and f.base == "string")
        broken = f"function {f.name}Initial(item: {e.name}): string {{\n  return item.{f.name}.charAt(0).toUpperCase();\n}}"
        error = f"'item.{f.name}' is possibly 'undefined'. (TS18048)"
        fixed = f"function {f.name}Initial(item: {e.name}): string {{\n  return item.{f.name}?.charAt(0).toUpperCase() ?? \"\";\n}}"
    else:
        f = rng.choice(e.fields[1:])
        broken = f"function pluck{cap(f.name)}(items) {{\n  return items.map((item) => item.{f.name});\n}}"
        error = "Parameter 'items' implicitly has an 'any' type. (TS7006)"
        ret = f"({f.type} | undefined)[]" if f.optional else (f"({f.type})[]" if "|" in f.type else f"{f.type}[]")
        fixed = f"function pluck{cap(f.name)}(items: readonly {e.name}[]): {ret} {{\n  return items.map((item) => item.{f.name});\n}}"
    instr = (f"Fix the type error in this TypeScript code (strict mode):\n\n{e.interface(export=False)}\n\n{broken}\n\n"
             f"The compiler says: {error}")
    return instr, fixed


def label(e: TsEntity) -> str | None:
    """The first required string field that is not the id, if any (a name, title, ...)."""
    strings = [f for f in e.of("string", required=True) if f is not e.id]
    return strings[0].name if strings else None


def ts_validate(rng, e):
    fields = [f for f in e.fields if f.base in ("string", "number") and not f.optional]
    if len(fields) < 2:
        return None
    chosen = rng.sample(fields, k=min(len(fields), rng.randint(2, 3)))
    rules = []
    for f in chosen:
        if f.base == "string":
            rules.append((f"`{f.name}` must be a non-empty string",
                          f"  if (typeof input.{f.name} !== \"string\" || input.{f.name}.trim() === \"\") {{\n    errors.push(\"{f.name} must be a non-empty string\");\n  }}"))
        else:
            rules.append((f"`{f.name}` must be a finite number >= 0",
                          f"  if (typeof input.{f.name} !== \"number\" || !Number.isFinite(input.{f.name}) || input.{f.name} < 0) {{\n    errors.push(\"{f.name} must be a finite number >= 0\");\n  }}"))
    name = camel("validate", e.name, "Input")
    picked = " | ".join(chr(34) + f.name + chr(34) for f in chosen)
    instr = (f"Write `{name}` that checks an untrusted object and returns a `Result` (ok with the typed value, or a list of error messages). Rules: "
             + "; ".join(r[0] for r in rules) + ".")
    code = (f"{e.interface()}\n\nexport type Result<T, E> = {{ ok: true; value: T }} | {{ ok: false; error: E }};\n\n"
            f"export type {e.name}Input = Pick<{e.name}, {picked}>;\n\n"
            f"export function {name}(input: Record<string, unknown>): Result<{e.name}Input, string[]> {{\n"
            f"  const errors: string[] = [];\n" + "\n".join(r[1] for r in rules) + "\n"
            f"  if (errors.length > 0) {{\n    return {{ ok: false, error: errors }};\n  }}\n"
            f"  return {{ ok: true, value: input as {e.name}Input }};\n}}")
    return instr, code


def ts_dto(rng, e):
    dates = e.of("Date")
    if not dates:
        return None
    name = camel("to", e.name, "Dto")
    conv = "".join(f"\n    {f.name}: {e.var}.{f.name}{'?' if f.optional else ''}.toISOString()," for f in dates)
    instr = f"Define `{e.name}Dto`, the JSON-safe version of {e.name} where every Date becomes an ISO string, and write `{name}` plus its inverse `from{e.name}Dto`."
    back = "".join(f"\n    {f.name}: {'dto.' + f.name + ' === undefined ? undefined : ' if f.optional else ''}new Date(dto.{f.name}),"
                   for f in dates)
    fields = "".join(f"\n  {f.name}{'?' if f.optional else ''}: string;" for f in dates)
    omit = " | ".join(chr(34) + f.name + chr(34) for f in dates)
    code = (f"{e.interface()}\n\nexport type {e.name}Dto = Omit<{e.name}, {omit}> & {{{fields}\n}};\n\n"
            f"export function {name}({e.var}: {e.name}): {e.name}Dto {{\n  return {{\n    ...{e.var},{conv}\n  }};\n}}\n\n"
            f"export function from{e.name}Dto(dto: {e.name}Dto): {e.name} {{\n  return {{\n    ...dto,{back}\n  }};\n}}")
    return instr, code


def ts_enum(rng, e):
    unions = e.of("union")
    if not unions:
        return None
    f = rng.choice(unions)
    values = [v.strip().strip('"') for v in f.type.split("|")]
    enum = f"{e.name}{cap(f.name)}"
    labels = {v: cap(v.replace("_", " ")) for v in values}
    if rng.random() < 0.5:
        members = "\n".join(f"  {cap(v)} = \"{v}\"," for v in values)
        code = (f"export enum {enum} {{\n{members}\n}}\n\nexport const {camel(enum, 'Labels')}: Record<{enum}, string> = {{\n"
                + "\n".join(f"  [{enum}.{cap(v)}]: \"{labels[v]}\"," for v in values)
                + f"\n}};\n\nexport function parse{enum}(raw: string): {enum} | undefined {{\n"
                f"  return (Object.values({enum}) as string[]).includes(raw) ? (raw as {enum}) : undefined;\n}}")
        instr = f"Replace the string union for {e.name}.{f.name} ({f.type.replace(chr(34), chr(39))}) with a string enum `{enum}`, add a label map and a safe `parse{enum}` function."
    else:
        code = (f"export const {camel(enum, 'Values')} = [{', '.join(chr(34) + v + chr(34) for v in values)}] as const;\n\n"
                f"export type {enum} = (typeof {camel(enum, 'Values')})[number];\n\n"
                f"export function is{enum}(value: unknown): value is {enum} {{\n"
                f"  return typeof value === \"string\" && ({camel(enum, 'Values')} as readonly string[]).includes(value);\n}}")
        instr = f"Derive the type `{enum}` ({f.type.replace(chr(34), chr(39))}) from a `const` array so the values exist at runtime too, and write a type guard for it."
    return instr, code


def ts_generic(rng, e):
    kind = rng.choice(["cache", "debounce", "retry", "paginate"])
    if kind == "cache":
        cap_n = rng.choice([50, 100, 500, 1000])
        instr = (f"Write a generic `LruCache<K, V>` class with a fixed capacity (evicts the least recently used entry), then "
                 f"create a cache of {e.plural.lower()} keyed by `{e.id.name}` with capacity {cap_n}.")
        code = (f"{e.interface()}\n\nexport class LruCache<K, V> {{\n  private readonly entries = new Map<K, V>();\n\n"
                f"  constructor(private readonly capacity: number) {{\n    if (capacity < 1) {{\n      throw new RangeError(\"capacity must be >= 1\");\n    }}\n  }}\n\n"
                f"  get(key: K): V | undefined {{\n    const value = this.entries.get(key);\n    if (value !== undefined) {{\n"
                f"      this.entries.delete(key);\n      this.entries.set(key, value);\n    }}\n    return value;\n  }}\n\n"
                f"  set(key: K, value: V): void {{\n    this.entries.delete(key);\n    this.entries.set(key, value);\n"
                f"    if (this.entries.size > this.capacity) {{\n      const oldest = this.entries.keys().next().value as K;\n"
                f"      this.entries.delete(oldest);\n    }}\n  }}\n}}\n\n"
                f"export const {e.var}Cache = new LruCache<{e.id.type}, {e.name}>({cap_n});")
    elif kind == "debounce":
        ms = rng.choice([150, 250, 300, 500])
        instr = f"Write a typed generic `debounce` helper that preserves the wrapped function's parameter types, and use it to debounce `save{e.name}(item: {e.name})` by {ms} ms."
        code = (f"{e.interface()}\n\nexport function debounce<A extends unknown[]>(fn: (...args: A) => void, waitMs: number): (...args: A) => void {{\n"
                f"  let timer: ReturnType<typeof setTimeout> | undefined;\n  return (...args: A) => {{\n"
                f"    if (timer !== undefined) {{\n      clearTimeout(timer);\n    }}\n    timer = setTimeout(() => fn(...args), waitMs);\n  }};\n}}\n\n"
                f"declare function save{e.name}(item: {e.name}): void;\n\nexport const debouncedSave{e.name} = debounce(save{e.name}, {ms});")
    elif kind == "retry":
        n = rng.randint(2, 6)
        instr = f"Write `withRetry<T>(task: () => Promise<T>, attempts: number)` with exponential backoff, and use it to load a {e.name} by id with {n} attempts."
        code = (f"{e.interface()}\n\nexport async function withRetry<T>(task: () => Promise<T>, attempts: number, baseDelayMs = 200): Promise<T> {{\n"
                f"  let lastError: unknown;\n  for (let attempt = 0; attempt < attempts; attempt++) {{\n    try {{\n      return await task();\n"
                f"    }} catch (error) {{\n      lastError = error;\n      await new Promise((resolve) => setTimeout(resolve, baseDelayMs * 2 ** attempt));\n"
                f"    }}\n  }}\n  throw lastError;\n}}\n\ndeclare function load{e.name}({e.id.name}: {e.id.type}): Promise<{e.name}>;\n\n"
                f"export function load{e.name}WithRetry({e.id.name}: {e.id.type}): Promise<{e.name}> {{\n  return withRetry(() => load{e.name}({e.id.name}), {n});\n}}")
    else:
        size = rng.choice([10, 20, 25, 50])
        instr = f"Write a generic async generator `paginate<T>` that walks a paged API until it runs out of items, and use it to collect every {e.name} with page size {size}."
        code = (f"{e.interface()}\n\nexport async function* paginate<T>(\n  fetchPage: (page: number, pageSize: number) => Promise<T[]>,\n  pageSize: number,\n): AsyncGenerator<T, void, undefined> {{\n"
                f"  for (let page = 1; ; page++) {{\n    const items = await fetchPage(page, pageSize);\n    yield* items;\n"
                f"    if (items.length < pageSize) {{\n      return;\n    }}\n  }}\n}}\n\n"
                f"declare function fetch{e.plural}Page(page: number, pageSize: number): Promise<{e.name}[]>;\n\n"
                f"export async function all{e.plural}(): Promise<{e.name}[]> {{\n  const result: {e.name}[] = [];\n"
                f"  for await (const item of paginate(fetch{e.plural}Page, {size})) {{\n    result.push(item);\n  }}\n  return result;\n}}")
    return instr, code


TS_KINDS = [(ts_interface, 10), (ts_filter, 10), (ts_aggregate, 10), (ts_group, 7), (ts_sort, 9), (ts_guard, 4),
            (ts_fetch, 4), (ts_utility, 9), (ts_store, 3), (ts_union, 3), (ts_fix, 10), (ts_validate, 2), (ts_dto, 4),
            (ts_enum, 6), (ts_generic, 3)]


def typescript_row(rng: Random) -> dict:
    kinds, weights = zip(*TS_KINDS)
    while True:
        entity = rng.choice(TS_ENTITY_LIST)
        rest = entity.fields[1:]
        keep = sorted(rng.sample(range(len(rest)), rng.randint(2, len(rest))))
        entity = TsEntity(entity.name, [entity.id] + [rest[i] for i in keep])  # a variant of the model
        kind = rng.choices(kinds, weights)[0]
        made = kind(rng, entity)
        if made:
            break
    instruction, output = made
    if kind in (ts_filter, ts_aggregate, ts_group, ts_sort) and rng.random() < 0.4:
        # The model type lives elsewhere in the codebase: import it instead of declaring it.
        output = output.replace(entity.interface(), f'import type {{ {entity.name} }} from "./models";', 1)
        instruction += f" The `{entity.name}` type is exported from `./models`."
    return {"instruction": instruction, "output": output}
