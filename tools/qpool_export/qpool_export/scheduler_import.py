"""Translates a diffusers scheduler_config.json into the manifest's `scheduler:` section and the
default sampler, refusing what qpool's schedulers (server/pipeline/scheduler/) do not compute.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from .import_error import ImportFailure

# diffusers scheduler class -> the qpool sampler a request gets by default. PNDM (what SD 1.x
# folders ship) has no qpool counterpart; DDIM runs the same schedule. DPMSolverMultistep's is
# dpmpp_2m_karras when its config asks for Karras sigmas, dpmpp_2m_sde(_karras) for
# sde-dpmsolver++.
DEFAULT_SAMPLER = {
    "DDIMScheduler": "ddim",
    "PNDMScheduler": "ddim",
    "EulerDiscreteScheduler": "euler",
    "EulerAncestralDiscreteScheduler": "euler_a",
    "DPMSolverMultistepScheduler": "dpmpp_2m",
    "UniPCMultistepScheduler": "unipc",
}
# The class's default timestep_spacing, for a file that leaves it out.
DEFAULT_SPACING = {"EulerDiscreteScheduler": "linspace", "EulerAncestralDiscreteScheduler": "linspace",
                   "DPMSolverMultistepScheduler": "linspace", "UniPCMultistepScheduler": "linspace"}
# DPMSolverMultistepScheduler settings qpool's dpmpp_2m computes (the class's defaults), with the
# values accepted. lower_order_final and euler_at_final change nothing at solver order 2 when the
# last sigma is 0: that step is first order anyway.
DPM_ACCEPTED = {
    "algorithm_type": ("dpmsolver++", "sde-dpmsolver++"),
    "solver_order": (2,),
    "solver_type": ("midpoint",),
    "final_sigmas_type": ("zero",),
    "variance_type": (None,),
    "use_lu_lambdas": (False,),
    "use_flow_sigmas": (False,),
    "use_dynamic_shifting": (False,),
    "lambda_min_clipped": (float("-inf"),),
}
# UniPCMultistepScheduler settings qpool's unipc computes (its defaults). Without
# lower_order_final the last step (to sigma 0) would take a second order that has no finite
# value; diffusers writes solver types it maps to bh2 as bh2.
UNIPC_ACCEPTED = {
    "solver_order": (2,),
    "solver_type": ("bh2",),
    "predict_x0": (True,),
    "lower_order_final": (True,),
    "disable_corrector": ([],),
    "final_sigmas_type": ("zero",),
    "use_flow_sigmas": (False,),
    "use_dynamic_shifting": (False,),
    "solver_p": (None,),
}
UNIPC_DEFAULTS = {"solver_order": 2, "solver_type": "bh2", "predict_x0": True,
                  "lower_order_final": True, "disable_corrector": [], "final_sigmas_type": "zero",
                  "use_flow_sigmas": False, "use_dynamic_shifting": False, "solver_p": None}
DPM_DEFAULTS = {"algorithm_type": "dpmsolver++", "solver_order": 2, "solver_type": "midpoint",
                "final_sigmas_type": "zero", "variance_type": None, "use_lu_lambdas": False,
                "use_flow_sigmas": False, "use_dynamic_shifting": False,
                "lambda_min_clipped": float("-inf")}

# Fields whose values qpool's schedulers compute, with the values accepted.
ACCEPTED = {
    "beta_schedule": ("scaled_linear", "linear"),
    "prediction_type": ("epsilon", "v_prediction"),
    "timestep_spacing": ("leading", "linspace", "trailing"),
}
# Fields that must have their neutral value (what diffusers does without them).
NEUTRAL = {
    "trained_betas": None,
    "rescale_betas_zero_snr": False,
    "thresholding": False,
    "use_karras_sigmas": False,
    "use_exponential_sigmas": False,
    "use_beta_sigmas": False,
    "timestep_type": "discrete",
    "interpolation_type": "linear",
    "final_sigmas_type": "zero",
    "sigma_min": None,
    "sigma_max": None,
}
# Fields that change nothing qpool computes.
IGNORED = {"_class_name", "_diffusers_version", "skip_prk_steps", "dynamic_thresholding_ratio",
           "sample_max_value", "clip_sample", "set_alpha_to_one", "clip_sample_range",
           "steps_offset", "num_train_timesteps",
           "beta_start", "beta_end", "beta_schedule", "prediction_type", "timestep_spacing",
           "_use_default_values", "lower_order_final", "euler_at_final", "flow_shift",
           "time_shift_type", *DPM_ACCEPTED}


# The ranges the server checks a manifest's numbers against (Note [Manifest number ranges] in
# server/config/manifest_sections.cpp): a value outside is refused here, naming the field, instead
# of being written into a manifest that no server loads.
RANGES = {"num_train_timesteps": (1, 10000), "steps_offset": (0, 9999),
          "beta_start": (0.0, 1.0), "beta_end": (0.0, 1.0), "shift": (0.0, 1000.0),
          "clip_sample_range": (1e-6, 1000.0),
          "base_shift": (-20.0, 20.0), "max_shift": (-20.0, 20.0),
          "base_image_seq_len": (1, 1 << 20), "max_image_seq_len": (1, 1 << 20)}


def number(config: Dict[str, object], field: str, default, where: str):
    """config[field] (or `default`) as the type of `default`, inside RANGES[field]; ImportFailure
    naming the field otherwise (a string, a list, NaN, 1e9)."""
    value = config.get(field, default)
    value = default if value is None else value
    kind = type(default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (kind is int and value != int(value)):
        raise ImportFailure(f"{where}: field '{field}' is {value!r}; expected a {kind.__name__}")
    low, high = RANGES[field]
    if not low <= value <= high:  # NaN fails too
        raise ImportFailure(f"{where}: field '{field}' is {value!r}; qpool serves {low} to {high}")
    return kind(value)


def sampler_note(config: Dict[str, object]) -> Optional[str]:
    """What the import says about the default sampler when the folder's scheduler class has no
    qpool sampler of its own (PNDM), else None."""
    if config.get("_class_name") != "PNDMScheduler":
        return None
    return ("scheduler: PNDMScheduler (PLMS) has no qpool sampler; requests without a scheduler "
            "get ddim, which runs the same schedule and makes images of its own (not PNDM's)")


def translate(config: Dict[str, object], where: str,
              kind: Optional[str] = None) -> Tuple[Dict[str, object], str]:
    """(the manifest's scheduler section, the default sampler name) for `config`, the parsed
    scheduler_config.json at `where`, of a pipeline of `kind` (sd: StableDiffusionPipeline,
    which turns DDIM's clip_sample off as it loads, with a deprecation warning; qpool does
    what it runs)."""
    cls = config.get("_class_name")
    if not isinstance(cls, str) or cls not in DEFAULT_SAMPLER:
        raise ImportFailure(f"{where}: field '_class_name' is {cls!r}; qpool imports "
                            f"{', '.join(sorted(DEFAULT_SAMPLER))}")
    sampler = DEFAULT_SAMPLER[cls]
    # Multistep solvers: their settings, and Karras sigmas as a sampler of their own.
    multistep = {"DPMSolverMultistepScheduler": (DPM_ACCEPTED, DPM_DEFAULTS),
                 "UniPCMultistepScheduler": (UNIPC_ACCEPTED, UNIPC_DEFAULTS)}
    if cls in multistep:
        accepted_values, defaults = multistep[cls]
        for field, accepted in accepted_values.items():
            value = config.get(field, defaults[field])
            if value not in accepted:
                raise ImportFailure(f"{where}: field '{field}' is {value!r}; qpool's {sampler} "
                                    f"computes {', '.join(repr(a) for a in accepted)}")
        if config.get("algorithm_type") == "sde-dpmsolver++":
            sampler = "dpmpp_2m_sde"
        if config.get("use_karras_sigmas", False):
            sampler += "_karras"
    for field, neutral in NEUTRAL.items():
        if field == "use_karras_sigmas" and cls in multistep:
            continue  # the sampler above
        value = config.get(field, neutral)
        if value != neutral:
            raise ImportFailure(f"{where}: field '{field}' is {value!r}; qpool's schedulers need "
                                f"{neutral!r}")
    section: Dict[str, object] = {
        "num_train_timesteps": number(config, "num_train_timesteps", 1000, where),
        "beta_start": number(config, "beta_start", 0.0001, where),
        "beta_end": number(config, "beta_end", 0.02, where),
        "beta_schedule": config.get("beta_schedule", "linear"),
        # A field the file leaves out takes the class's default, as diffusers does.
        "timestep_spacing": config.get("timestep_spacing", DEFAULT_SPACING.get(cls, "leading")),
        "steps_offset": number(config, "steps_offset", 0, where),
        "prediction_type": config.get("prediction_type", "epsilon"),
    }
    for field, accepted in ACCEPTED.items():
        if section[field] not in accepted:
            raise ImportFailure(f"{where}: field '{field}' is {section[field]!r}; qpool imports "
                                f"{', '.join(accepted)}")
    if cls == "DDIMScheduler":
        # DDIMScheduler clips x0 and ends on alpha 1 unless told not to (its defaults); the
        # server's ddim does as the section says. PNDM and Euler read neither.
        for field in ("set_alpha_to_one", "clip_sample"):
            value = config.get(field, True)
            if not isinstance(value, bool):
                raise ImportFailure(f"{where}: field '{field}' is {value!r}; expected true or "
                                    f"false")
            section[field] = value
        if kind == "sd":
            section["clip_sample"] = False
        if section["clip_sample"]:
            section["clip_sample_range"] = number(config, "clip_sample_range", 1.0, where)
    return section, sampler


# FlowMatchEulerDiscreteScheduler fields the manifest's flow-matching section carries, with
# diffusers' defaults.
FLOW_FIELDS = {"num_train_timesteps": 1000, "shift": 1.0, "use_dynamic_shifting": False,
               "base_shift": 0.5, "max_shift": 1.15, "base_image_seq_len": 256,
               "max_image_seq_len": 4096}
# Fields that must keep their neutral value: qpool's flow-matching Euler computes no other.
FLOW_NEUTRAL = {"invert_sigmas": False, "shift_terminal": None, "use_karras_sigmas": False,
                "use_exponential_sigmas": False, "use_beta_sigmas": False,
                "time_shift_type": "exponential", "stochastic_sampling": False}


# UniPCMultistepScheduler on flow sigmas (HiDream-I1 Full's): what qpool's flow unipc computes
# (Note [Flow-matching UniPC] in server/pipeline/scheduler/flow_unipc_scheduler.h), with the
# values accepted; the fields of its DDPM schedule change nothing on flow sigmas.
UNIPC_FLOW_ACCEPTED = {**UNIPC_ACCEPTED, "use_flow_sigmas": (True,),
                       "prediction_type": ("flow_prediction",)}
UNIPC_FLOW_NEUTRAL = {"thresholding": False, "use_karras_sigmas": False,
                      "use_exponential_sigmas": False, "use_beta_sigmas": False,
                      "shift_terminal": None, "time_shift_type": "exponential",
                      "sigma_min": None, "sigma_max": None}
UNIPC_FLOW_IGNORED = {"_class_name", "_diffusers_version", "_use_default_values",
                      "beta_start", "beta_end", "beta_schedule", "trained_betas",
                      "rescale_betas_zero_snr", "timestep_spacing", "steps_offset",
                      "dynamic_thresholding_ratio", "sample_max_value", "flow_shift",
                      "num_train_timesteps"}


def require_neutral(config: Dict[str, object], neutral: Dict[str, object], where: str,
                    sampler: str) -> None:
    """ImportFailure naming the first field of `neutral` whose value in config is another."""
    for field, value in neutral.items():
        if config.get(field, value) != value:
            raise ImportFailure(f"{where}: field '{field}' is {config[field]!r}; qpool's "
                                f"flow-matching {sampler} needs {value!r}")


def translate_unipc_flow(config: Dict[str, object], where: str,
                         kind: str) -> Tuple[Dict[str, object], str]:
    """(the manifest's scheduler section, "unipc") of a UniPCMultistepScheduler config on flow
    sigmas; its flow_shift is the section's static shift. HiDreamImagePipeline passes UniPC no
    mu, so kind hidream takes no dynamic shifting (diffusers fails on it)."""
    defaults = {**UNIPC_DEFAULTS, "prediction_type": "epsilon"}
    for field, values in UNIPC_FLOW_ACCEPTED.items():
        value = config.get(field, defaults[field])
        if field == "use_dynamic_shifting" and kind == "flux":
            values = (False, True)
        if value not in values:
            raise ImportFailure(f"{where}: field '{field}' is {value!r}; qpool's flow-matching "
                                f"unipc computes {' or '.join(repr(v) for v in values)}")
    require_neutral(config, UNIPC_FLOW_NEUTRAL, where, "unipc")
    known = {*UNIPC_FLOW_ACCEPTED, *UNIPC_FLOW_NEUTRAL, *UNIPC_FLOW_IGNORED}
    for field in config:
        if field not in known:
            raise ImportFailure(f"{where}: field '{field}' of UniPCMultistepScheduler is not one "
                                f"qpool's flow-matching unipc computes")
    section: Dict[str, object] = dict(FLOW_FIELDS)
    section["num_train_timesteps"] = number(config, "num_train_timesteps", 1000, where)
    section["shift"] = number({"shift": config.get("flow_shift")}, "shift", 1.0, where)
    section["use_dynamic_shifting"] = bool(config.get("use_dynamic_shifting", False))
    return section, "unipc"


def translate_flow(config: Dict[str, object], where: str,
                   kind: str = "flux") -> Tuple[Dict[str, object], str]:
    """(the manifest's scheduler section, the sampler) of a FlowMatchEulerDiscreteScheduler
    config, or of a UniPCMultistepScheduler one on flow sigmas (kinds flux and hidream)."""
    cls = config.get("_class_name")
    if cls == "UniPCMultistepScheduler" and config.get("use_flow_sigmas"):
        return translate_unipc_flow(config, where, kind)
    if not isinstance(cls, str) or cls != "FlowMatchEulerDiscreteScheduler":
        raise ImportFailure(f"{where}: field '_class_name' is {cls!r}; kind {kind} imports "
                            f"FlowMatchEulerDiscreteScheduler, or UniPCMultistepScheduler with "
                            f"use_flow_sigmas (a folder with another scheduler imports once "
                            f"scheduler_config.json is replaced by one of those)")
    require_neutral(config, FLOW_NEUTRAL, where, "Euler")
    section: Dict[str, object] = {}
    for field, default in FLOW_FIELDS.items():
        if field in RANGES:
            section[field] = number(config, field, default, where)
            continue
        value = config.get(field, default)
        value = default if value is None else value
        if not isinstance(value, bool):
            raise ImportFailure(f"{where}: field '{field}' is {value!r}; expected a bool")
        section[field] = value
    return section, "euler"
