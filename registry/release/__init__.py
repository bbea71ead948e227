"""Releasing versions: alias flips with history (`aliases`), the gates before them (`gates`), engine reload
hooks with flip-back (`hooks`), and golden-set checks whose records gates read (`check`)."""
