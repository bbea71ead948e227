"""The child process of the random-damage property test: mutate a tiny model seed by seed, convert it, report.

Run as `python -m support.mutations MODEL_DIR FIRST LAST` (with tests/ and the repository on
sys.path) under the parent's memory limit. For each seed it damages the safetensors header bytes or
a config.json size (or, one seed in ten, changes the config in a way that keeps it valid), runs
`mreg convert --to gguf:F16 --json` in this process, and prints one JSON line: the seed, the exit
code, whether stderr held a traceback, the error's hint and, for a conversion that was published,
its verification, whether `mreg verify` passes and whether the safetensors library itself opens
the damaged file. The parent bounds each seed's wall time.
"""

from __future__ import annotations

import json
import random
import struct
import sys
from pathlib import Path
from typing import Any

HOSTILE_VALUES: list[Any] = [-1, 0, 10**12, 2**63, "x", None, True, 1.5, [], {}]
SIZE_KEYS = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "intermediate_size", "max_position_embeddings"]


def mutate(rnd: random.Random, seed: int, weights: bytes, config: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """Odd seeds: flip 1-4 header bytes, sometimes cut the file short; even seeds: one config size set absurd,
    except every tenth, which changes what leaves the model valid (its context length), so that the property
    "a published version passed" is exercised too."""
    (n,) = struct.unpack("<Q", weights[:8])
    data = bytearray(weights)
    if seed % 10 == 0:
        return bytes(data), {**config, "max_position_embeddings": rnd.choice([16, 64, 256, 4096])}
    if seed % 2:
        for _ in range(rnd.randint(1, 4)):
            data[rnd.randrange(8 + n)] = rnd.randrange(256)
        if rnd.random() < 0.3:
            del data[rnd.randrange(len(data)):]
        return bytes(data), config
    return bytes(data), {**config, rnd.choice(SIZE_KEYS): rnd.choice(HOSTILE_VALUES)}


def loadable(path: Path) -> bool:
    """Whether the safetensors library opens the file and reads every tensor."""
    from safetensors import safe_open

    try:
        with safe_open(path, "numpy") as f:
            for k in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                f.get_tensor(k)
    except Exception:  # noqa: BLE001 - its error types vary by version; any of them means "not loadable"
        return False
    return True


def main(base: Path, first: int, last: int) -> None:
    """Seeds [first, last) against the model in `base`; one JSON line each on stdout."""
    from support.cli import run

    weights, config = (base / "model.safetensors").read_bytes(), json.loads((base / "config.json").read_text())
    rnd = random.Random(1234)
    for seed in range(first, last):
        data, conf = mutate(rnd, seed, weights, config)
        (base / "model.safetensors").write_bytes(data)
        (base / "config.json").write_text(json.dumps(conf))
        r = run("convert", base, "--to", "gguf:F16", "--name", f"p{seed}", "--json")
        report: dict[str, Any] = {"seed": seed, "exit": r.exit_code, "traceback": "Traceback" in r.stderr}
        try:
            doc = json.loads(r.stdout)
        except ValueError:
            doc = None
        report["json"] = doc is not None
        if doc is not None and r.exit_code == 0:
            report["verification"] = doc["verification"]["gguf"]
            report["verify_exit"] = run("verify", f"p{seed}@{doc['version']}").exit_code
            report["loadable"] = loadable(base / "model.safetensors")
        elif doc is not None:
            report["hint"] = bool(doc.get("error", {}).get("hint"))
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
