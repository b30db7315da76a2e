"""Options in one frozen struct, each field's range declared once and checked when built.

A bus's options are a ``BusOptions``; a run's (``handlers.RunOptions``) and an
adapter's (``adapters.AdapterOptions``) extend it. Every field carries its
range as ``msgspec.Meta`` constraints, and an instance exists only with every
field in range: ``__post_init__`` has msgspec check it, however it was built
(keywords, ``msgspec.structs.replace``, decoding). NaN, infinities, absurd sizes
and wrong types are so refused by the call the user made, with an error that
names the option and its range, before any task starts. The keyword arguments
of ``EventBus``, ``open_run`` and the adapters are the friendly way to build one.
"""

from ._options import OptionError, checked

__all__ = ["OptionError", "checked"]
