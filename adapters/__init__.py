"""adapters: the edges of the runtime (command line, Hugging Face Trainer, Ray Train).

Third-party libraries are imported only here, lazily, behind extras.
"""

__all__: list[str] = []
