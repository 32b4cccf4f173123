"""Loglikelihood requests per second: our lm-eval model vs lm-eval's ``hf`` backend on the
exported model.

Same machine, same weights (the tiny config's model, exported to a Llama folder), same requests:
the offline word-order task's 200 items x 2 continuations, and the rolling perplexity documents.
Each backend scores every request set twice; the second (warm) pass is timed.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]


class Request:
    def __init__(self, *args) -> None:
        self.args = args


def requests() -> dict[str, list[Request]]:
    from fixed_embed.evaluation.tasks.offline_data import docs_ppl, word_order

    items = word_order()["test"]
    choice = [Request(item["query"], c) for item in items for c in item["choices"]]
    rolling = [Request(doc["text"]) for doc in docs_ppl()["test"]]
    return {"loglikelihood": choice, "loglikelihood_rolling": rolling}


def timed(method, reqs) -> float:
    method(reqs, disable_tqdm=True)
    start = time.perf_counter()
    method(reqs, disable_tqdm=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variant", default="gf2", choices=["learned", "binary16", "gf2"])
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()

    from lm_eval.models.huggingface import HFLM

    from fixed_embed.cli.train import FixedEmbedCLI
    from fixed_embed.evaluation.export import export_llama
    from fixed_embed.evaluation.lm_eval_model import FixedEmbedLM

    with tempfile.TemporaryDirectory() as tmp:
        cli = FixedEmbedCLI(
            args=["--config", str(ROOT / f"experiments/tiny/{args.variant}.yaml")], run=False
        )
        model, tokenizer = cli.model.eval(), cli.datamodule.tokenizer
        ours = FixedEmbedLM(
            module=model, tokenizer_object=tokenizer, batch_size=args.batch_size, dtype="float32"
        )
        export_llama(model, tokenizer, Path(tmp) / "hf")
        hf = HFLM(
            pretrained=str(Path(tmp) / "hf"),
            dtype="float32",
            batch_size=args.batch_size,
            device="cpu",
        )
        table = Table(
            title=f"lm-eval requests/s, tiny {args.variant} model, batch {args.batch_size}, CPU"
        )
        for column in ("request type", "requests", "fixed_embed req/s", "hf req/s", "ratio"):
            table.add_column(column, justify="left" if column == "request type" else "right")
        for kind, reqs in requests().items():
            ours_s, hf_s = timed(getattr(ours, kind), reqs), timed(getattr(hf, kind), reqs)
            table.add_row(
                kind,
                str(len(reqs)),
                f"{len(reqs) / ours_s:,.1f}",
                f"{len(reqs) / hf_s:,.1f}",
                f"{hf_s / ours_s:.2f}",
            )
    Console(width=120).print(table)


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
