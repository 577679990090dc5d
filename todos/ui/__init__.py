"""The operator Board: HTMX pages over the store's operator twins."""
