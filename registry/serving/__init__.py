"""What serving engines see: the mount contract and its check (`mount`), Triton model repositories (`triton`)."""
