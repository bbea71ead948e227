"""The read-only web view of a store: `mreg ui` serves its pages live, `mreg site build` writes them as files.

It owns what a person reads in a browser: the documents each page shows (`documents`, also the pages' JSON
twins), the pages and their paths (`pages`, one set of Jinja templates for both), the pictures drawn on the
server (`svg`), the GET-only HTTP server (`server`) and the static site (`site`). It reads the store through
its protocol, as the CLI does, and writes nothing to it; it serves pages only, never a store file.
"""
