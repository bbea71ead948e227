"""What serving engines see: the mount contract and its check (`mount`), Triton model repositories (`triton`),
what a version costs to serve in a memory budget (`memory`)."""
