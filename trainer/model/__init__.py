"""The model side: loading, adapters, attention, memory, compilation, export."""
