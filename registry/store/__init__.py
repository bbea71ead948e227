"""The store: immutable versions with manifests, content-addressed blobs, aliases; local or S3.

`protocol` is what the rest of mreg sees (`Store`, `Version`); `local` and `s3` are the two backends
(`s3` built on `bucket`, the bucket's primitive object operations); `staging` builds a local version
before it is published; `transfer` is the one push (a local version to a sink, an S3 store or an OCI
target) and the one sync (a version from a source, an S3 alias or an OCI artifact, into the local
store), `s3_transfer` the S3 end of both; `verify` re-hashes a version and `gc` collects what
nothing needs, each for either backend behind one call; `signatures` signs versions (OpenSSF
model-signing) and judges their signatures against `trust`, the policy from the config file. boto3
is imported only by `s3` and `bucket`, model-signing only by `signatures`, when used.
"""
