"""Tests of qpool_export.scheduler_import: the scheduler configs diffusers writes, class by class,
become the manifest's scheduler section and default sampler, or are refused naming the field.

Run: .venv/bin/python -m pytest tests/python/test_scheduler_import.py
"""

import json
import re
import os
import sys

import pytest

diffusers = pytest.importorskip("diffusers")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "qpool_export"))
from qpool_export import scheduler_import  # noqa: E402
from qpool_export.import_error import ImportFailure  # noqa: E402

SD15 = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")


def written(cls_name, tmp_path, **config):
    """The scheduler_config.json diffusers writes for `cls_name` made with `config`, parsed."""
    getattr(diffusers, cls_name)(**config).save_config(tmp_path)
    return json.loads((tmp_path / "scheduler_config.json").read_text())


@pytest.mark.parametrize("cls_name, extra, sampler, spacing", [
    ("PNDMScheduler", {"skip_prk_steps": True, "steps_offset": 1}, "ddim", "leading"),
    ("DDIMScheduler", {"clip_sample": False, "set_alpha_to_one": False}, "ddim", "leading"),
    ("EulerDiscreteScheduler", {}, "euler", "linspace"),
    ("EulerAncestralDiscreteScheduler", {"timestep_spacing": "trailing"}, "euler_a", "trailing"),
    ("DPMSolverMultistepScheduler", {}, "dpmpp_2m", "linspace"),
    ("DPMSolverMultistepScheduler", {"use_karras_sigmas": True}, "dpmpp_2m_karras", "linspace"),
    ("DPMSolverMultistepScheduler", {"algorithm_type": "sde-dpmsolver++"}, "dpmpp_2m_sde",
     "linspace"),
    ("DPMSolverMultistepScheduler", {"algorithm_type": "sde-dpmsolver++",
                                     "use_karras_sigmas": True}, "dpmpp_2m_sde_karras",
     "linspace"),
    ("UniPCMultistepScheduler", {}, "unipc", "linspace"),
    ("UniPCMultistepScheduler", {"use_karras_sigmas": True, "timestep_spacing": "trailing"},
     "unipc_karras", "trailing"),
])
def test_default_sampler_and_section(tmp_path, cls_name, extra, sampler, spacing):
    config = written(cls_name, tmp_path, **SD15, **extra)
    section, got = scheduler_import.translate(config, "scheduler_config.json")
    assert got == sampler
    assert section["timestep_spacing"] == spacing
    assert section["beta_start"] == pytest.approx(0.00085)
    assert section["steps_offset"] == extra.get("steps_offset", 0)


@pytest.mark.parametrize("cls_name, config, message", [
    ("DEISMultistepScheduler", {}, "field '_class_name' is 'DEISMultistepScheduler'"),
    ("UniPCMultistepScheduler", {"solver_order": 3}, "field 'solver_order' is 3"),
    ("UniPCMultistepScheduler", {"solver_type": "bh1"}, "field 'solver_type' is 'bh1'"),
    ("UniPCMultistepScheduler", {"disable_corrector": [0]}, "field 'disable_corrector' is [0]"),
    ("UniPCMultistepScheduler", {"lower_order_final": False},
     "field 'lower_order_final' is False"),
    ("DPMSolverMultistepScheduler", {"solver_order": 3}, "field 'solver_order' is 3"),
    ("DPMSolverMultistepScheduler", {"solver_type": "heun"}, "field 'solver_type' is 'heun'"),
    ("DPMSolverMultistepScheduler", {"algorithm_type": "sde-dpmsolver",
                                     "final_sigmas_type": "sigma_min"},
     "field 'algorithm_type' is 'sde-dpmsolver'"),
    ("DPMSolverMultistepScheduler", {"final_sigmas_type": "sigma_min"},
     "field 'final_sigmas_type' is 'sigma_min'"),
    ("DPMSolverMultistepScheduler", {"use_lu_lambdas": True}, "field 'use_lu_lambdas' is True"),
    ("EulerDiscreteScheduler", {"use_karras_sigmas": True}, "field 'use_karras_sigmas' is True"),
    ("EulerAncestralDiscreteScheduler", {"rescale_betas_zero_snr": True},
     "field 'rescale_betas_zero_snr' is True"),
])
def test_what_the_samplers_do_not_compute_is_refused(tmp_path, cls_name, config, message):
    with pytest.raises(ImportFailure, match=re.escape(message)):
        scheduler_import.translate(written(cls_name, tmp_path, **SD15, **config),
                                   "scheduler_config.json")


@pytest.mark.parametrize("config, message", [
    ({"num_train_timesteps": 1000000000}, "field 'num_train_timesteps' is 1000000000; qpool serves"),
    ({"num_train_timesteps": "1000"}, "field 'num_train_timesteps' is '1000'; expected a int"),
    ({"beta_end": float("nan")}, "field 'beta_end' is nan"),
    ({"steps_offset": [1]}, "field 'steps_offset' is [1]"),
    ({"_class_name": ["DDIMScheduler"]}, "field '_class_name' is ['DDIMScheduler']"),
])
def test_hostile_numbers_and_types_are_refused_naming_the_field(tmp_path, config, message):
    """Note [Manifest number ranges]: a downloaded scheduler_config.json is input; 1e9 timesteps
    once went into a manifest, and a list as _class_name ended in a traceback."""
    with pytest.raises(ImportFailure, match=re.escape(message)):
        written_config = written("EulerDiscreteScheduler", tmp_path, **SD15)
        scheduler_import.translate({**written_config, **config}, "scheduler_config.json")


def test_ddim_with_its_defaults_clips_and_ends_on_alpha_one(tmp_path):
    section, sampler = scheduler_import.translate(written("DDIMScheduler", tmp_path, **SD15),
                                                  "scheduler_config.json")
    assert sampler == "ddim"
    assert (section["set_alpha_to_one"], section["clip_sample"]) == (True, True)
    assert section["clip_sample_range"] == 1.0
    section, _ = scheduler_import.translate(
        written("DDIMScheduler", tmp_path, **SD15, clip_sample=False), "scheduler_config.json")
    assert not section["clip_sample"] and "clip_sample_range" not in section
    # StableDiffusionPipeline turns clip_sample off as it loads; SDXL's pipeline keeps it.
    config = written("DDIMScheduler", tmp_path, **SD15)
    assert not scheduler_import.translate(config, "s.json", "sd")[0]["clip_sample"]
    assert scheduler_import.translate(config, "s.json", "sdxl")[0]["clip_sample"]
    with pytest.raises(ImportFailure, match=re.escape("field 'clip_sample_range' is 1e+30")):
        scheduler_import.translate({**written("DDIMScheduler", tmp_path, **SD15),
                                    "clip_sample_range": 1e30}, "scheduler_config.json")


def test_hostile_flow_numbers_are_refused_naming_the_field():
    with pytest.raises(ImportFailure, match=re.escape("field 'max_image_seq_len' is 1e+30")):
        scheduler_import.translate_flow({"_class_name": "FlowMatchEulerDiscreteScheduler",
                                         "max_image_seq_len": 1e30}, "scheduler_config.json")


def test_unipc_on_flow_sigmas_imports_as_flow_unipc(tmp_path):
    """HiDream-I1 Full's scheduler: UniPC on flow sigmas, its flow_shift the static shift; the
    settings qpool's flow unipc does not compute are refused naming the field."""
    config = written("UniPCMultistepScheduler", tmp_path, use_flow_sigmas=True,
                     prediction_type="flow_prediction", flow_shift=3.0)
    section, sampler = scheduler_import.translate_flow(config, "s.json", "hidream")
    assert sampler == "unipc"
    assert section["shift"] == 3.0 and not section["use_dynamic_shifting"]
    assert section["num_train_timesteps"] == 1000
    dynamic = {**config, "use_dynamic_shifting": True}
    assert scheduler_import.translate_flow(dynamic, "s.json", "flux")[0]["use_dynamic_shifting"]
    for field, value in (("use_dynamic_shifting", True), ("prediction_type", "epsilon"),
                         ("solver_order", 3), ("use_karras_sigmas", True),
                         ("shift_terminal", 0.1), ("invented", 1)):
        with pytest.raises(ImportFailure, match=re.escape(f"field '{field}'")):
            scheduler_import.translate_flow({**config, field: value}, "s.json", "hidream")
    # Without flow sigmas UniPC is a DDPM scheduler, which flow-matching kinds refuse.
    with pytest.raises(ImportFailure, match="field '_class_name'"):
        scheduler_import.translate_flow({**config, "use_flow_sigmas": False}, "s.json", "flux")
