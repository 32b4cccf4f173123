"""Export as a Hugging Face ``LlamaForCausalLM`` folder; what Llama cannot express is refused,
not approximated."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer

from fixed_embed.atomic import atomic_folder
from fixed_embed.data.tokenizer import EOS, special_token_id
from fixed_embed.errors import ConfigError, OutputExistsError, writing
from fixed_embed.run.lock import acquire
from fixed_embed.train.module import LanguageModel

MARKER = "fixed_embed.json"  # written last: a folder holding it is a complete export
#: A block's modules by their Llama names (the projections inside have the same names).
_LLAMA_MODULES = {
    "attn_norm": "input_layernorm",
    "attn": "self_attn",
    "mlp_norm": "post_attention_layernorm",
}


def check_export_dir(out: str | os.PathLike, overwrite: bool = False) -> None:
    """Raise unless an export may go to ``out``: missing, empty, or with ``overwrite`` an
    export."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"export path {out} is a file, not a folder; choose a folder")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise OutputExistsError(
                f"export folder {out} exists and is not empty; choose another folder, "
                "or pass --overwrite to replace an earlier export there"
            )
        if not (out / MARKER).is_file():
            raise OutputExistsError(
                f"export folder {out} is not empty and is not an earlier export (no {MARKER}): "
                "--overwrite only replaces exports; choose another folder"
            )


def llama_state_dict(model: LanguageModel) -> dict[str, torch.Tensor]:
    """Our weights under transformers' Llama names (a fixed interface materialised as
    embed_tokens)."""
    decoder = model.decoder
    state = {
        "model.embed_tokens.weight": decoder.interface.table(),
        "model.norm.weight": decoder.norm.weight,
    }
    if not decoder.config.tie_embeddings:
        state["lm_head.weight"] = decoder.head.weight
    for name, weight in decoder.layers.named_parameters():  # "0.attn.q_proj.weight", ...
        index, module, rest = name.split(".", 2)
        state[f"model.layers.{index}.{_LLAMA_MODULES.get(module, module)}.{rest}"] = weight
    return {k: v.detach().contiguous() for k, v in state.items()}


def export_llama(
    model: LanguageModel,
    tokenizer: Tokenizer,
    out: str | os.PathLike,
    dtype: torch.dtype = torch.float32,
    overwrite: bool = False,
) -> Path:
    """Write ``out/`` (config.json, model.safetensors, tokenizer files, fixed_embed.json) as a
    whole; return it."""
    import transformers

    config, out = model.decoder.config, Path(out)
    eos = special_token_id(tokenizer, EOS)
    hf_config = transformers.LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        intermediate_size=config.ffn_dim,
        num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads,
        num_key_value_heads=config.kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_seq_len,
        rms_norm_eps=config.norm_eps,
        rope_theta=config.rope_theta,
        tie_word_embeddings=config.tie_embeddings,
        bos_token_id=eos,
        eos_token_id=eos,
        torch_dtype=dtype,
    )
    state = {k: v.to("cpu", dtype).contiguous() for k, v in llama_state_dict(model).items()}
    with (
        acquire(out, "or choose another OUT", beside=True),
        writing(out),
        atomic_folder(out) as tmp,
    ):
        check_export_dir(out, overwrite)  # under its lock: an export that ended meanwhile is kept
        hf_config.save_pretrained(tmp)
        save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tokenizer,
            eos_token=EOS,
            bos_token=EOS,
            unk_token=None,
            model_max_length=config.max_seq_len,
        )
        fast.save_pretrained(tmp)
        marker = {**getattr(model, "provenance", {}), "interface": model.decoder.interface.spec()}
        (tmp / MARKER).write_text(
            json.dumps({**marker, "decoder": asdict(config)}, indent=2) + "\n"
        )
    return out
