"""A tiny model fitted on a tiny corpus, with the batches and losses it saw, for the training
tests."""

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from fixed_embed.data import TextDataModule
from fixed_embed.interfaces import GF2CodeInput
from fixed_embed.train.module import LanguageModel

TINY_DECODER = {
    "vocab_size": 300,
    "d_model": 32,
    "n_layers": 2,
    "n_heads": 4,
    "ffn_dim": 64,
    "max_seq_len": 16,
}


class BatchRecorder(L.Callback):
    def __init__(self):
        self.batches, self.losses = [], []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.batches.append(batch.clone())
        self.losses.append(outputs["loss"].item())


class StopAt(L.Callback):
    """Interrupt a run at ``step`` (the LR schedule still follows the full max_steps)."""

    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step >= self.step:
            trainer.should_stop = True


def fit_tiny(
    tmp_path,
    corpus,
    stop_at,
    workers=0,
    ckpt_path=None,
    interface=GF2CodeInput,
    max_steps=9,
    callbacks=(),
    accumulate=1,
    expect_step=None,
    logger=False,
    clip=None,
    decoder=None,
    **model_options,
):
    data, tok = corpus
    L.seed_everything(0)
    model = LanguageModel(
        decoder={**TINY_DECODER, **(decoder or {})},
        interface=interface,
        schedule={"warmup_steps": 2},
        optimizer={"lr": 1e-2},
        **model_options,
    )
    dm = TextDataModule(
        train=str(data),
        tokenizer=str(tok),
        seq_len=16,
        batch_size=4,
        num_workers=workers,
        num_shards=4,
        shuffle_buffer=8,
        val_sequences=4,
        holdout_per_mille=100,
    )
    recorder = BatchRecorder()
    checkpoint = ModelCheckpoint(
        dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=1, save_top_k=0
    )
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=max_steps,
        logger=logger,
        enable_progress_bar=False,
        log_every_n_steps=1,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        limit_val_batches=0,
        accumulate_grad_batches=accumulate,
        gradient_clip_val=clip,
        callbacks=[recorder, StopAt(stop_at), *callbacks, checkpoint],
    )
    trainer.fit(model, dm, ckpt_path=ckpt_path)
    assert trainer.global_step == (stop_at if expect_step is None else expect_step)
    return recorder, model
