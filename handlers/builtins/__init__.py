"""The built-in training callbacks' modules; import the callbacks from ``handlers``."""

__all__: list[str] = []
