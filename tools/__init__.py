"""Tooling of the repository (not installed with minixl): tools/book builds the book."""
