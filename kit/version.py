"""kit's version: one bottom module that imports nothing, so that any layer may name it
(``kit/__init__.py`` re-exports it as ``kit.__version__``; pyproject.toml's is the same)."""

__version__ = "0.1.0"
