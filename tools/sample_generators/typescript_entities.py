"""The TypeScript samples' data: the entities (interfaces with typed fields) as text in a small line
language and its parser (:data:`TS_ENTITY_LIST`), and the utility types (:data:`TS_UTILITIES`);
typescript.py generates the tasks over them."""

from __future__ import annotations

from dataclasses import dataclass

from sample_generators.common import plural


# ================================================================================================
# TypeScript: task instruction -> code
#
# Entities: "Name: field type; ..." (a trailing ? marks an optional field). Tasks combine an entity,
# some of its fields and one of a dozen task kinds.

TS_ENTITIES = """
User: id number; name string; email string; age number; isActive boolean; createdAt Date; role "admin" | "editor" | "viewer"; tags string[]; nickname? string
Product: id string; title string; price number; stock number; category "books" | "toys" | "tools" | "garden"; discontinued boolean; rating? number
Order: id string; customerId string; total number; currency "USD" | "EUR" | "GBP"; status "pending" | "paid" | "shipped" | "cancelled"; placedAt Date; itemCount number; couponCode? string
Invoice: id number; number string; amount number; dueDate Date; paid boolean; customerName string; lineCount number; notes? string
Task: id number; title string; done boolean; priority "low" | "medium" | "high"; estimateHours number; assignee? string; dueAt? Date
Book: isbn string; title string; author string; pages number; publishedYear number; genre "fiction" | "history" | "science" | "poetry"; available boolean
Flight: code string; origin string; destination string; departure Date; seatsLeft number; price number; status "scheduled" | "delayed" | "landed" | "cancelled"
Employee: id number; fullName string; department string; salary number; hiredAt Date; remote boolean; managerId? number
Ticket: id number; subject string; severity "low" | "normal" | "urgent"; open boolean; createdAt Date; reporterEmail string; assigneeId? number
Article: slug string; title string; body string; wordCount number; published boolean; publishedAt? Date; tags string[]
SensorReading: sensorId string; timestamp Date; temperature number; humidity number; batteryLevel number; faulty boolean
Transaction: id string; accountId string; amount number; kind "credit" | "debit"; bookedAt Date; description string; pending boolean
Movie: id number; title string; year number; rating number; genres string[]; runtimeMinutes number; director? string
Recipe: id number; name string; servings number; prepMinutes number; vegetarian boolean; cuisine "italian" | "thai" | "mexican" | "indian"; ingredients string[]
Vehicle: vin string; make string; model string; year number; mileage number; fuel "petrol" | "diesel" | "electric" | "hybrid"; forSale boolean
Course: code string; title string; credits number; capacity number; enrolled number; level "intro" | "intermediate" | "advanced"; instructor? string
Appointment: id number; patientName string; startsAt Date; durationMinutes number; confirmed boolean; kind "checkup" | "followup" | "surgery"
Repo: id number; name string; stars number; forks number; language string; archived boolean; updatedAt Date; license? string
Song: id number; title string; artist string; durationSeconds number; plays number; explicit boolean; album? string
HotelRoom: number string; floor number; beds number; nightlyRate number; smoking boolean; view "sea" | "city" | "garden"
Shipment: trackingId string; weightKg number; destinationCountry string; shippedAt Date; delivered boolean; carrier "dhl" | "ups" | "fedex" | "post"
Review: id number; productId string; stars number; text string; verified boolean; createdAt Date; helpfulVotes number
"""


@dataclass
class TsField:
    name: str
    type: str
    optional: bool

    @property
    def decl(self) -> str:
        return f"{self.name}{'?' if self.optional else ''}: {self.type};"

    @property
    def base(self) -> str:
        """typeof-able kind: string | number | boolean | Date | array | union."""
        if self.type.endswith("[]"):
            return "array"
        if '"' in self.type:
            return "union"
        return self.type


@dataclass
class TsEntity:
    name: str
    fields: list[TsField]

    @property
    def id(self) -> TsField:
        return self.fields[0]

    @property
    def plural(self) -> str:
        return plural(self.name)

    @property
    def var(self) -> str:
        return self.name[0].lower() + self.name[1:]

    def of(self, *bases: str, required: bool = False) -> list[TsField]:
        return [f for f in self.fields if f.base in bases and not (required and f.optional)]

    def interface(self, fields: list[TsField] | None = None, export: bool = True) -> str:
        body = "\n".join(f"  {f.decl}" for f in (fields or self.fields))
        return f"{'export ' if export else ''}interface {self.name} {{\n{body}\n}}"


def parse_ts_entities(text: str) -> list[TsEntity]:
    entities = []
    for line in text.strip().splitlines():
        name, _, body = line.partition(": ")
        fields = []
        for spec in body.split("; "):
            field_name, type_ = spec.split(" ", 1)
            fields.append(TsField(field_name.rstrip("?"), type_, field_name.endswith("?")))
        entities.append(TsEntity(name, fields))
    return entities


TS_ENTITY_LIST = parse_ts_entities(TS_ENTITIES)


TS_UTILITIES = {
    "DeepPartial": ("makes every property optional, recursively (arrays and Dates stay as they are)",
                    "export type DeepPartial<T> = T extends Date | readonly unknown[]\n  ? T\n  : T extends object\n    ? { [K in keyof T]?: DeepPartial<T[K]> }\n    : T;"),
    "DeepReadonly": ("makes every property readonly, recursively, including arrays",
                     "export type DeepReadonly<T> = T extends (infer U)[]\n  ? ReadonlyArray<DeepReadonly<U>>\n  : T extends Date\n    ? T\n    : T extends object\n      ? { readonly [K in keyof T]: DeepReadonly<T[K]> }\n      : T;"),
    "KeysOfType": ("gives the keys of T whose value type is assignable to V",
                   "export type KeysOfType<T, V> = {\n  [K in keyof T]-?: T[K] extends V ? K : never;\n}[keyof T];"),
    "PickByType": ("picks the properties of T whose value type is assignable to V",
                   "export type PickByType<T, V> = {\n  [K in keyof T as T[K] extends V ? K : never]: T[K];\n};"),
    "OptionalKeys": ("gives the union of the optional keys of T",
                     "export type OptionalKeys<T> = {\n  [K in keyof T]-?: {} extends Pick<T, K> ? K : never;\n}[keyof T];"),
    "Mutable": ("removes readonly from every property of T",
                "export type Mutable<T> = {\n  -readonly [K in keyof T]: T[K];\n};"),
    "Nullable": ("allows null for every property of T",
                 "export type Nullable<T> = {\n  [K in keyof T]: T[K] | null;\n};"),
    "RequireKeys": ("makes the keys K of T required and leaves the rest unchanged",
                    "export type RequireKeys<T, K extends keyof T> = Omit<T, K> & Required<Pick<T, K>>;"),
    "Serialized": ("turns every Date property of T into an ISO string, as JSON.stringify does",
                   "export type Serialized<T> = {\n  [K in keyof T]: T[K] extends Date\n    ? string\n    : T[K] extends Date | undefined\n      ? string | undefined\n      : T[K];\n};"),
    "ValueOf": ("gives the union of the value types of T", "export type ValueOf<T> = T[keyof T];"),
    "Setters": ("maps each property `foo` of T to a method `setFoo(value)`",
                "export type Setters<T> = {\n  [K in keyof T as `set${Capitalize<string & K>}`]: (value: T[K]) => void;\n};"),
}
