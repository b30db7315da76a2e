"""handlers: training semantics on top of the event bus."""

__all__: list[str] = []
