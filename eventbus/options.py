"""Options in one frozen struct, each field's range declared once and checked when built.

``BusOptions``, ``handlers.RunOptions`` and ``adapters.AdapterOptions`` exist only with every
field in range, however they were built, so a bad value is refused by the call the user
made, naming the option and its range.
"""

from ._options import OptionError, checked

__all__ = ["OptionError", "checked"]
