"""Conversion: the converter protocol (`protocol`), the format table that names every converter (`formats`),
a pure plan (`plan`: order, options, the conversion key) and its execution (`execute`: stage, convert,
verify, publish). The registry imports no converter statically: `formats` loads them by name."""
