"""converters.hf.quiet: torch's and transformers' noise kept off stderr, and nothing of the host process changed."""

from __future__ import annotations

import logging
import sys

import pytest

pytest.importorskip("transformers")


def test_the_root_logger_and_stdout_stay_the_hosts(capsys: pytest.CaptureFixture[str]) -> None:
    """onnxruntime's quantizer logs through the root logger (`logging.warning`), which would leave a handler on
    a root logger that has none; print() is the host's business (the exporters print nothing with verbose=False)."""
    from converters.hf.quiet import quiet

    root = logging.getLogger()
    handlers, level, stdout = list(root.handlers), root.level, sys.stdout
    root.handlers.clear()  # as in a host that configured no logging (pytest's own handlers put back below)
    try:
        with quiet():
            logging.warning("Please consider to run pre-processing before quantization.")
            logging.error("an error still shows")
            print("the host's stdout")
            assert sys.stdout is stdout
        assert root.handlers == [] and root.level == level, "no handler left behind, the level as it was"
    finally:
        root.handlers[:] = handlers
    out, err = capsys.readouterr()
    assert out == "the host's stdout\n"
    assert "pre-processing" not in err and "an error still shows" in err
