"""bench/import_bench.py's pipeline twins: a copy of an imported pipeline whose manifest adds an
execution section, with the weights hard-linked rather than copied (the server's side of such a
manifest: tests/integration/test_warmup.py)."""
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import import_bench  # noqa: E402


def test_a_twin_adds_its_execution_section_and_links_the_weights(tmp_path):
    base = tmp_path / "sd15"
    base.mkdir()
    (base / "pipeline.yaml").write_text("kind: sd\n")
    (base / "unet.pt").write_bytes(b"weights")
    import_bench.execution_variant(str(tmp_path), "sd15", "sd15-warm", "  warmup: true\n")
    twin = tmp_path / "sd15-warm"
    assert (twin / "pipeline.yaml").read_text() == "kind: sd\nexecution:\n  warmup: true\n"
    assert (base / "pipeline.yaml").read_text() == "kind: sd\n", "the base's manifest is untouched"
    assert os.path.samefile(twin / "unet.pt", base / "unet.pt")

