"""The manual's reference pages, generated from the code: `python -m services.manual`."""
