"""The book's tooling, not part of the installed library: the exporter (chapters -> minixl),
its lints, the pair and quoted-number checks, the chapter runner and the website builder.

Run it from the repository root as ``python -m tools.book export|check|run`` and
``python -m tools.book.site``; `make export`, `make check`, `make run` and `make html` do.
"""
