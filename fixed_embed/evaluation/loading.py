"""A trained model and its checkpoint's tokenizer, for evaluation and export: read weights-only,
memory-mapped."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from tokenizers import Tokenizer

from fixed_embed.data.tokenizer import load_tokenizer, tokenizer_mismatch
from fixed_embed.distributed.checkpoint import consolidate, load_weights_only
from fixed_embed.errors import CheckpointError, MissingFileError
from fixed_embed.model.accounting import derived_buffers
from fixed_embed.run.lock import acquire
from fixed_embed.train.module import LanguageModel


def load_checkpoint(
    path: str | os.PathLike, tokenizer: str | None = None, device: str | torch.device = "cpu"
) -> tuple[LanguageModel, Tokenizer]:
    """The model (eval, on ``device``) and tokenizer of a checkpoint file or sharded folder
    (``tokenizer``: if none)."""
    path = Path(path)
    if not path.exists():
        raise MissingFileError(f"checkpoint not found: {path}")
    # A reader's record while it reads: a fit's retention keeps this checkpoint until a later save.
    with acquire(path.resolve(), "or pass another checkpoint", beside=True, shared=True):
        checkpoint = (
            consolidate(path) if path.is_dir() else load_weights_only(path, path, mmap=True)
        )
    if not isinstance(checkpoint, dict) or not {"state_dict", "hyper_parameters"} <= set(
        checkpoint
    ):
        keys = sorted(checkpoint)[:8] if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise CheckpointError(
            f"{path} is not a fixed-embed LanguageModel checkpoint (expected 'state_dict' and "
            "'hyper_parameters', "
            f"found {keys})"
        )
    # a refusal before the model is built
    tokenizer_object = _tokenizer(checkpoint, tokenizer, path)
    hparams = {k: v for k, v in checkpoint["hyper_parameters"].items() if not k.startswith("_")}
    try:
        with torch.device("meta"):  # no random init of weights that are about to be overwritten
            model = LanguageModel(**hparams)
    except (TypeError, ValueError, KeyError) as error:
        raise CheckpointError(
            f"{path} holds hyper-parameters no LanguageModel can be built from "
            f"({type(error).__name__}: "
            f"{str(error)[:200]}); pass a checkpoint written by fixed-embed fit"
        ) from error
    model.to_empty(device=device)
    for owner in dict.fromkeys(name.rpartition(".")[0] for name in derived_buffers(model)):
        model.get_submodule(owner).reset_parameters()  # derived buffers are rebuilt, not stored
    try:
        model.load_state_dict(checkpoint["state_dict"], strict=True)
    except RuntimeError as error:
        raise CheckpointError(
            f"{path}: its weights do not fit the model its hyper-parameters describe "
            f"({str(error).splitlines()[0]})"
        ) from error
    model.to(
        device
    ).eval()  # to_empty moved the tensors; .to also records the device on the LightningModule
    # What a result scored: the file a last.ckpt link resolves to now, and its update (eval, export
    # record it).
    model.provenance = {"checkpoint": str(path.resolve()), "update": checkpoint.get("global_step")}
    return model, tokenizer_object


def _tokenizer(checkpoint: dict, override: str | None, path: Path) -> Tokenizer:
    saved = [
        s["tokenizer_json"]
        for s in checkpoint.values()
        if isinstance(s, dict) and "tokenizer_json" in s
    ]
    own = Tokenizer.from_str(saved[0]) if saved else None
    given = override and load_tokenizer(override)
    what = f"{path}'s own tokenizer"
    if own and given and (why := tokenizer_mismatch(own, what, given, f"override {override}")):
        raise CheckpointError(
            f"{why}: the model's ids would mean other text; drop the tokenizer override "
            "(--tokenizer, tokenizer=): the checkpoint holds its own"
        )
    if not (own or given):
        raise CheckpointError(
            f"{path} holds no tokenizer; pass one (a tokenizer.json, a folder with one, or a hub "
            "id)"
        )
    return given or own
