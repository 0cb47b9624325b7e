"""One module per collective; the selection table is in select.py."""
