"""OCI registries and OCI image layouts as a distribution channel: versions published as ModelPack artifacts.

A version becomes one OCI image manifest (``artifactType`` ``application/vnd.cncf.model.manifest.v1+json``)
whose layers are the store's blobs as they are (same sha256, uncompressed), one per file, plus mreg's own
manifest as a layer, so a pull reproduces the version byte for byte::

    manifest (PUT last, under the tag)
      config   application/vnd.cncf.model.config.v1+json   descriptor / config / modelfs.diffIds
      layers   application/vnd.cncf.model.weight.v1.raw     title hf/model.safetensors   (= store blob sha256)
               application/vnd.cncf.model.weight.config.v1.raw  title hf/config.json
               application/vnd.cncf.model.doc.v1.raw        title hf/README.md
               application/vnd.mreg.manifest.v1+json        title .mreg/manifest.json (digest = manifest digest)

Each signature record of the version follows as a referrer of that manifest (``subject``): a
Sigstore-bundle artifact, found through the referrers API, the ``sha256-<hex>`` tag schema, or a
layout's index.json (`referrers`, pure); `signatures` packs, reads and judges them.

`reference` parses ``oci://HOST/REPO:TAG|@sha256:…``, ``oci-layout:DIR[:TAG]`` and
``oci-archive:FILE.tar[:TAG]``; `pack` builds the manifest and config (pure); `image` builds the
same version as a regular image (`--as-image`: one deterministic tar layer per file, for
Kubernetes image volumes; `base` reads an image to build on, `unpack` reads mreg's images back
as their versions); `registry` (HTTP, with `auth`, resuming chunked uploads from the sessions
`uploads` keeps in the store's tmp/), `layout` (a directory) and `archive` (a layout as one tar
file, read in place) are the targets behind one protocol (`target`); `transfer` pushes, pulls
into the cache and syncs into a store.
Tags are names, not aliases: promotion stays in the store.
"""
