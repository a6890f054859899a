"""Persistence: the store's ports by role (`base`), and two stores that implement every one of them.

`sqlite` is the default (one file, one process); `postgres` is what several
replicas share. The statements they send alike are written once
(`statements`), and their rows become records in one place (`rows`).
"""
