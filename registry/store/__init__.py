"""The store: immutable versions with manifests, content-addressed blobs, aliases; local or S3.

`protocol` is what the rest of mreg sees (`Store`, `Version`); `local` and `s3` are the two
backends; `transfer` moves versions between them (push, sync); `verify` re-hashes a version and
`gc` collects what nothing needs, each for either backend behind one call. boto3 is imported
only by `s3`.
"""
