"""Single-file checkpoints written from diffusers pipelines, in the layouts users' files have:
the original Stable Diffusion layout (CompVis' LDM, as AUTOMATIC1111 and ComfyUI save SD 1.x,
2.x and SDXL), OpenCLIP's text tower, and Black Forest Labs' FLUX transformer with CLIP-L, T5 and
VAE files beside it. The mapping is written here from the published layouts, apart from the
importer's (which reads these files the other way), and diffusers' own `from_single_file` reads
every file the tests import, so a layout wrong here fails there first.
"""

import re

import torch

RESNET = {"norm1": "in_layers.0", "conv1": "in_layers.2", "time_emb_proj": "emb_layers.1",
          "norm2": "out_layers.0", "conv2": "out_layers.3", "conv_shortcut": "skip_connection"}


def _resnet(rest):
    leaf, _, tail = rest.partition(".")
    return f"{RESNET[leaf]}.{tail}"


def ldm_unet(unet):
    """{LDM name: tensor} of a UNet2DConditionModel (model.diffusion_model.*)."""
    cfg = unet.config
    step = cfg.layers_per_block + 1
    attention = [t.startswith("CrossAttn") for t in cfg.up_block_types]
    top = {"conv_in": "input_blocks.0.0", "time_embedding.linear_1": "time_embed.0",
           "time_embedding.linear_2": "time_embed.2", "add_embedding.linear_1": "label_emb.0.0",
           "add_embedding.linear_2": "label_emb.0.2", "conv_norm_out": "out.0",
           "conv_out": "out.2"}
    out = {}
    for key, value in unet.state_dict().items():
        module, _, leaf = key.rpartition(".")
        if module in top:
            name = f"{top[module]}.{leaf}"
        elif m := re.fullmatch(r"down_blocks\.(\d+)\.(resnets|attentions)\.(\d+)\.(.+)", key):
            n = 1 + int(m[1]) * step + int(m[3])
            name = f"input_blocks.{n}.0.{_resnet(m[4])}" if m[2] == "resnets" else \
                f"input_blocks.{n}.1.{m[4]}"
        elif m := re.fullmatch(r"down_blocks\.(\d+)\.downsamplers\.0\.conv\.(.+)", key):
            name = f"input_blocks.{(int(m[1]) + 1) * step}.0.op.{m[2]}"
        elif m := re.fullmatch(r"mid_block\.resnets\.(\d)\.(.+)", key):
            name = f"middle_block.{2 * int(m[1])}.{_resnet(m[2])}"
        elif key.startswith("mid_block.attentions.0."):
            name = "middle_block.1." + key[len("mid_block.attentions.0."):]
        elif m := re.fullmatch(r"up_blocks\.(\d+)\.(resnets|attentions)\.(\d+)\.(.+)", key):
            n = int(m[1]) * step + int(m[3])
            name = f"output_blocks.{n}.0.{_resnet(m[4])}" if m[2] == "resnets" else \
                f"output_blocks.{n}.1.{m[4]}"
        elif m := re.fullmatch(r"up_blocks\.(\d+)\.upsamplers\.0\.conv\.(.+)", key):
            block = int(m[1])
            name = f"output_blocks.{block * step + step - 1}.{2 if attention[block] else 1}" \
                   f".conv.{m[2]}"
        else:
            raise KeyError(key)
        out["model.diffusion_model." + name] = value
    return out


VAE_RESNET = {"norm1": "norm1", "conv1": "conv1", "norm2": "norm2", "conv2": "conv2",
              "conv_shortcut": "nin_shortcut"}
VAE_ATTENTION = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out": "proj_out"}


def ldm_vae(vae, prefix="first_stage_model."):
    """{LDM name: tensor} of an AutoencoderKL, encoder and decoder; the mid attention's
    projections as 1x1 convolutions."""
    levels = len(vae.config.block_out_channels)
    out = {}
    for key, value in vae.state_dict().items():
        name = key
        if m := re.fullmatch(r"(encoder|decoder)\.(down|up)_blocks\.(\d+)\.(resnets|downsamplers"
                             r"|upsamplers)\.(\d+)\.(.+)", key):
            level = int(m[3]) if m[1] == "encoder" else levels - 1 - int(m[3])
            if m[4] == "resnets":
                leaf, _, tail = m[6].partition(".")
                name = f"{m[1]}.{m[2]}.{level}.block.{m[5]}.{VAE_RESNET[leaf]}.{tail}"
            else:
                name = f"{m[1]}.{m[2]}.{level}.{'downsample' if m[2] == 'down' else 'upsample'}" \
                       f".{m[6]}"
        elif m := re.fullmatch(r"(encoder|decoder)\.mid_block\.resnets\.(\d)\.(\w+)\.(.+)", key):
            name = f"{m[1]}.mid.block_{int(m[2]) + 1}.{VAE_RESNET[m[3]]}.{m[4]}"
        elif m := re.fullmatch(r"(encoder|decoder)\.mid_block\.attentions\.0\.(\w+)\.(?:0\.)?(.+)",
                               key):
            name = f"{m[1]}.mid.attn_1.{VAE_ATTENTION[m[2]]}.{m[3]}"
            if value.dim() == 2:
                value = value[:, :, None, None]
        elif m := re.fullmatch(r"(encoder|decoder)\.conv_norm_out\.(.+)", key):
            name = f"{m[1]}.norm_out.{m[2]}"
        out[prefix + name] = value
    return out


def hf_clip(encoder, prefix):
    """{name: tensor} of a CLIPTextModel as LDM files keep it: transformers' names under
    text_model. (which transformers 5's CLIPTextModel no longer has), with the position ids."""
    out = {}
    for key, value in encoder.state_dict().items():
        key = key[len("text_model."):] if key.startswith("text_model.") else key
        out[prefix + ("text_model." + key if key != "text_projection.weight" else key)] = value
    length = encoder.config.max_position_embeddings
    out[prefix + "text_model.embeddings.position_ids"] = torch.arange(length)[None]
    return out


def open_clip(encoder, prefix, extra_layer=False):
    """{OpenCLIP name: tensor} of a CLIPTextModel(WithProjection): fused in_proj, the text
    projection transposed (a random one where the model has none, as SD 2.x files carry it),
    and with `extra_layer` one more random resblock past the model's (SD 2.x's text encoder
    stops at OpenCLIP's penultimate layer)."""
    state = {k[len("text_model."):] if k.startswith("text_model.") else k: v
             for k, v in encoder.state_dict().items()}
    cfg = encoder.config
    out = {"token_embedding.weight": state["embeddings.token_embedding.weight"],
           "positional_embedding": state["embeddings.position_embedding.weight"],
           "ln_final.weight": state["final_layer_norm.weight"],
           "ln_final.bias": state["final_layer_norm.bias"],
           "logit_scale": torch.tensor(4.6052)}
    out["text_projection"] = state["text_projection.weight"].t().contiguous() \
        if "text_projection.weight" in state else torch.randn(cfg.hidden_size, cfg.hidden_size)
    names = {"layer_norm1": "ln_1", "layer_norm2": "ln_2", "mlp.fc1": "mlp.c_fc",
             "mlp.fc2": "mlp.c_proj", "self_attn.out_proj": "attn.out_proj"}
    for i in range(cfg.num_hidden_layers + int(extra_layer)):
        at = f"encoder.layers.{min(i, cfg.num_hidden_layers - 1)}."
        for leaf in ("weight", "bias"):
            fused = torch.cat([state[f"{at}self_attn.{p}_proj.{leaf}"] for p in "qkv"])
            out[f"transformer.resblocks.{i}.attn.in_proj_{leaf}"] = fused
            for new, old in names.items():
                out[f"transformer.resblocks.{i}.{old}.{leaf}"] = state[f"{at}{new}.{leaf}"]
        if i == cfg.num_hidden_layers:  # the extra layer: random, never read
            for k in list(out):
                if k.startswith(f"transformer.resblocks.{i}."):
                    out[k] = torch.randn_like(out[k])
    return {prefix + k: v.contiguous() for k, v in out.items()}


def sd_checkpoint(pipe, family):
    """The whole pipeline as one {name: tensor}: family sd1, sd2 or sdxl."""
    out = {**ldm_unet(pipe.unet), **ldm_vae(pipe.vae)}
    if family == "sd1":
        out.update(hf_clip(pipe.text_encoder, "cond_stage_model.transformer."))
    elif family == "sd2":
        out.update(open_clip(pipe.text_encoder, "cond_stage_model.model.", extra_layer=True))
    else:
        out.update(hf_clip(pipe.text_encoder, "conditioner.embedders.0.transformer."))
        out.update(open_clip(pipe.text_encoder_2, "conditioner.embedders.1.model."))
    # What A1111 files also carry: the training schedule's buffers.
    out["alphas_cumprod"] = torch.linspace(0.99, 0.01, 1000)
    return {k: v.detach().contiguous() for k, v in out.items()}


def bfl_flux(transformer):
    """{Black Forest Labs name: tensor} of a FluxTransformer2DModel: fused qkv (the single
    blocks' with the MLP's input after it), the final modulation as shift then scale."""
    state = transformer.state_dict()
    top = {"x_embedder": "img_in", "context_embedder": "txt_in",
           "time_text_embed.timestep_embedder.linear_1": "time_in.in_layer",
           "time_text_embed.timestep_embedder.linear_2": "time_in.out_layer",
           "time_text_embed.text_embedder.linear_1": "vector_in.in_layer",
           "time_text_embed.text_embedder.linear_2": "vector_in.out_layer",
           "time_text_embed.guidance_embedder.linear_1": "guidance_in.in_layer",
           "time_text_embed.guidance_embedder.linear_2": "guidance_in.out_layer",
           "proj_out": "final_layer.linear"}
    double = {"norm1.linear": "img_mod.lin", "norm1_context.linear": "txt_mod.lin",
              "attn.to_out.0": "img_attn.proj", "attn.to_add_out": "txt_attn.proj",
              "ff.net.0.proj": "img_mlp.0", "ff.net.2": "img_mlp.2",
              "ff_context.net.0.proj": "txt_mlp.0", "ff_context.net.2": "txt_mlp.2"}
    norms = {"attn.norm_q": "img_attn.norm.query_norm", "attn.norm_k": "img_attn.norm.key_norm",
             "attn.norm_added_q": "txt_attn.norm.query_norm",
             "attn.norm_added_k": "txt_attn.norm.key_norm"}
    single = {"norm.linear": "modulation.lin", "proj_out": "linear2"}
    single_norms = {"attn.norm_q": "norm.query_norm", "attn.norm_k": "norm.key_norm"}
    out = {}
    for module, name in top.items():
        for leaf in ("weight", "bias"):
            if f"{module}.{leaf}" in state:
                out[f"{name}.{leaf}"] = state[f"{module}.{leaf}"]
    for leaf in ("weight", "bias"):
        scale, shift = state[f"norm_out.linear.{leaf}"].chunk(2)
        out[f"final_layer.adaLN_modulation.1.{leaf}"] = torch.cat([shift, scale])
    for i in range(transformer.config.num_layers):
        at = f"transformer_blocks.{i}."
        for leaf in ("weight", "bias"):
            out[f"double_blocks.{i}.img_attn.qkv.{leaf}"] = torch.cat(
                [state[f"{at}attn.to_{p}.{leaf}"] for p in "qkv"])
            out[f"double_blocks.{i}.txt_attn.qkv.{leaf}"] = torch.cat(
                [state[f"{at}attn.add_{p}_proj.{leaf}"] for p in "qkv"])
            for module, name in double.items():
                out[f"double_blocks.{i}.{name}.{leaf}"] = state[f"{at}{module}.{leaf}"]
        for module, name in norms.items():
            out[f"double_blocks.{i}.{name}.scale"] = state[f"{at}{module}.weight"]
    for i in range(transformer.config.num_single_layers):
        at = f"single_transformer_blocks.{i}."
        for leaf in ("weight", "bias"):
            out[f"single_blocks.{i}.linear1.{leaf}"] = torch.cat(
                [state[f"{at}attn.to_{p}.{leaf}"] for p in "qkv"] +
                [state[f"{at}proj_mlp.{leaf}"]])
            for module, name in single.items():
                out[f"single_blocks.{i}.{name}.{leaf}"] = state[f"{at}{module}.{leaf}"]
        for module, name in single_norms.items():
            out[f"single_blocks.{i}.{name}.scale"] = state[f"{at}{module}.weight"]
    return {k: v.detach().contiguous() for k, v in out.items()}
