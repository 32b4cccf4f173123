"""lm-eval model ``fixed_embed`` (a checkpoint or live model, scored as ``hf``); tqdm: no file,
for console to route."""

from __future__ import annotations

from collections.abc import Callable
from itertools import groupby
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import Collator, chunks, postprocess_generated_text
from tokenizers import Tokenizer
from tqdm import tqdm

from fixed_embed.data.tokenizer import EOS, special_token_id
from fixed_embed.evaluation.loading import load_checkpoint
from fixed_embed.train.module import LanguageModel


class EvaluationInterrupted(Exception):
    """Raised between forward passes when ``interrupt()`` asks to stop (e.g. a SIGTERM during
    training)."""


@register_model("fixed_embed")
class FixedEmbedLM(TemplateLM):
    """Args (``--model_args`` of lm-eval):
    checkpoint: a LanguageModel ``.ckpt``.
    tokenizer: for a checkpoint that holds none (another than the one it holds is refused).
    batch_size: requests per forward pass.
    device: ``cuda``, ``cpu``, ... (default: cuda if available).
    dtype: ``auto`` (bf16 autocast where supported), ``bfloat16`` or ``float32``.
    max_length: context length L (default: the model's max_seq_len).
    max_gen_toks: default generation budget for ``generate_until``.
    eos_token: the end-of-text token, also the prefix of empty contexts and rolling windows.
    module, tokenizer_object: a live model and its tokenizer instead of ``checkpoint``.
    distributed: split the requests over the ranks of the initialised process group.
    interrupt: polled per batch (not in multi-rank generation); true raises
    EvaluationInterrupted on all ranks.
    """

    # max_batch_size: lm-eval passes it to every model; batches here are fixed
    def __init__(
        self,
        checkpoint: str | None = None,
        tokenizer: str | None = None,
        batch_size: int | str = 16,
        device: str | None = None,
        dtype: str = "auto",
        max_length: int | None = None,
        max_gen_toks: int = 256,
        eos_token: str = EOS,
        module: LanguageModel | None = None,
        tokenizer_object: Tokenizer | None = None,
        distributed: bool = False,
        max_batch_size: int | None = None,
        interrupt: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__()
        if (checkpoint is None) == (module is None) or (tokenizer_object is None) != (
            module is None
        ):
            raise ValueError(
                "pass checkpoint=PATH (its tokenizer inside), or module=LanguageModel, "
                "tokenizer_object="
            )
        if not str(batch_size).isdigit() or int(batch_size) < 1:
            raise ValueError(
                f"batch_size must be an integer >= 1 for fixed_embed (no auto), got {batch_size!r}"
            )
        self.batch_size = int(batch_size)
        if module is None:
            device = device or ("cuda" if torch.cuda.is_available() else "cpu")
            module, tokenizer_object = load_checkpoint(checkpoint, tokenizer, device)
        self.module, self.tok, self._device = module, tokenizer_object, module.device
        self.max_length = int(max_length or module.config.max_seq_len)
        if not 1 <= self.max_length <= module.config.max_seq_len:
            raise ValueError(
                f"max_length must lie in [1, {module.config.max_seq_len}], got {self.max_length}"
            )
        self.max_gen_toks, self._eot = max_gen_toks, special_token_id(self.tok, eos_token)
        if dtype not in ("auto", "bfloat16", "float32"):
            raise ValueError(f"dtype must be auto, bfloat16 or float32, got {dtype!r}")
        cuda_bf16 = self.device.type == "cuda" and torch.cuda.is_bf16_supported()
        self.bf16 = dtype == "bfloat16" or (dtype == "auto" and cuda_bf16)
        self.interrupt = interrupt
        if distributed:
            self._rank, self._world_size = dist.get_rank(), dist.get_world_size()

    def _check_interrupt(self) -> None:
        if self.interrupt is None:
            return
        stop = bool(self.interrupt())
        if self.world_size > 1:
            vote = torch.tensor(float(stop), device=self.device)
            dist.all_reduce(vote, op=dist.ReduceOp.MAX)
            stop = bool(vote.item())
        if stop:
            raise EvaluationInterrupted("evaluation stopped on request")

    # distributed hooks lm-eval calls when world_size > 1
    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor)
        return torch.stack(parts) if tensor.dim() == 0 else torch.cat(parts)

    def gather_object(self, obj: Any, dst: int = 0) -> list | None:
        gathered = [None] * self.world_size if self.rank == dst else None
        dist.gather_object(obj, gathered, dst=dst)
        return gathered

    def barrier(self) -> None:
        dist.barrier()

    @property
    def eot_token_id(self) -> int:
        return self._eot

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **kwargs: Any
    ) -> list[int]:
        return self.tok.encode(string, add_special_tokens=bool(add_special_tokens)).ids

    def tok_decode(self, tokens: list[int]) -> str:
        """The text of ``tokens``, end-of-text tokens included (stop sequences may hold them)."""
        return self.tok.decode(tokens, skip_special_tokens=False)

    def _loglikelihood_tokens(
        self, requests: list[tuple[Any, list, list]], disable_tqdm: bool = False
    ) -> list[tuple[float, bool]]:
        collator = Collator(requests, sort_fn=lambda r: (-len(r[1] + r[2]), tuple(r[1] + r[2])))
        results = []
        progress = tqdm(
            total=len(requests), disable=disable_tqdm or self.rank != 0, desc="loglikelihood"
        )
        for chunk in collator.get_batched(n=self.batch_size):
            self._check_interrupt()
            inputs = []
            for _, context, continuation in chunk:
                if not context or not continuation:
                    raise ValueError(
                        f"empty context or continuation: {context!r}, {continuation!r}"
                    )
                if len(continuation) > self.max_length:
                    raise ValueError(
                        f"a continuation of {len(continuation)} tokens cannot be scored "
                        f"within the context length {self.max_length}"
                    )
                inputs.append((context + continuation)[-(self.max_length + 1) :][:-1])
            logits = self._logits(inputs)
            for row, ((_, _, continuation), tokens) in enumerate(zip(chunk, inputs, strict=True)):
                n, length = len(continuation), len(tokens)
                # log-softmax over the continuation's positions only: [n, V], not [B, T, V]
                span = F.log_softmax(logits[row, length - n : length].float(), dim=-1)
                target = torch.tensor(continuation, device=span.device)
                # its log-likelihood, and whether greedy decoding gives it
                results.append(
                    (
                        span.gather(-1, target[:, None]).sum().item(),
                        bool((span.argmax(-1) == target).all()),
                    )
                )
                progress.update(1)
        progress.close()
        return collator.get_original(results)

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        windows, owners = [], []
        for index, (string,) in enumerate(req.args for req in requests):
            rolling = lm_utils.get_rolling_token_windows(
                self.tok_encode(string), self.prefix_token_id, self.max_length, context_len=1
            )
            for context, target in map(lm_utils.make_disjoint_window, rolling):
                windows.append((None, context, target))
                owners.append(index)
        real = len(windows)
        if self.world_size > 1:
            # Every rank runs as many forward passes (FSDP all-gathers in forward): the rest score
            # padding.
            counts = self.all_gather(torch.tensor(real, device=self.device))
            padding = (
                windows[0] if windows else (None, [self.prefix_token_id], [self.prefix_token_id])
            )
            windows += [padding] * (int(counts.max()) - real)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)[:real]
        totals = [0.0] * len(requests)
        for owner, (score, _) in zip(owners, scores, strict=True):
            totals[owner] += score
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        if self.world_size > 1 and any(hasattr(p, "to_local") for p in self.module.parameters()):
            # Ranks stop generating at different steps, so their FSDP all-gathers would not pair up.
            raise NotImplementedError(
                "generate_until on a sharded (FSDP) model across ranks is not supported: score "
                "generation "
                "tasks with fixed-embed eval on the (consolidated) checkpoint"
            )
        jobs, eot = [], self.tok_decode([self.eot_token_id])
        for context, gen_kwargs in (req.args for req in requests):
            kwargs = gen_kwargs or {}
            if kwargs.get("do_sample", False) and kwargs.get("temperature", 0.0) > 0:
                raise ValueError(
                    "fixed_embed generates greedily only; got do_sample=True with temperature > 0"
                )
            until = kwargs.get("until") or []
            until = [stop for stop in ([until] if isinstance(until, str) else until) if stop]
            limit = int(kwargs.get("max_gen_toks", self.max_gen_toks))
            jobs.append((self.tok_encode(context), [*until, eot], limit))
        # Batch equal-length contexts: no padding, no attention mask needed while generating.
        order = sorted(range(len(jobs)), key=lambda i: -len(jobs[i][0]))
        outputs: list[str] = [""] * len(jobs)
        progress = tqdm(
            total=len(jobs), disable=disable_tqdm or self.rank != 0, desc="generate_until"
        )
        for _, same_length in groupby(order, key=lambda i: len(jobs[i][0])):
            for group in chunks(same_length, self.batch_size):
                if self.world_size == 1:
                    self._check_interrupt()
                for index, text in zip(group, self._greedy([jobs[i] for i in group]), strict=True):
                    outputs[index] = text
                    self.cache_hook.add_partial("generate_until", requests[index].args, text)
                progress.update(len(group))
        progress.close()
        return outputs

    @torch.inference_mode()
    def _logits(self, inputs: list[list[int]]) -> torch.Tensor:
        """Logits for right-padded ``inputs``: [B, longest, V]."""
        rows = [torch.tensor(tokens, dtype=torch.long) for tokens in inputs]
        batch = torch.nn.utils.rnn.pad_sequence(
            rows, batch_first=True, padding_value=self.eot_token_id
        )
        # no mode to set: the model has no layer that trains differently
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            return self.module(batch.to(self.device))

    def _greedy(self, jobs: list[tuple[list[int], list[str], int]]) -> list[str]:
        """Equal-length contexts, decoded together; every row takes a token each step so they
        stay equal."""
        generated: list[list[int]] = [[] for _ in jobs]
        for _ in range(max(limit for _, _, limit in jobs)):
            inputs = [
                (context + g)[-self.max_length :]
                for (context, _, _), g in zip(jobs, generated, strict=True)
            ]
            for row, token in enumerate(self._logits(inputs)[:, -1].argmax(-1).tolist()):
                generated[row].append(token)
            if all(
                len(tokens) >= limit or any(stop in self.tok_decode(tokens) for stop in until)
                for tokens, (_, until, limit) in zip(generated, jobs, strict=True)
            ):
                break
        return [
            postprocess_generated_text(self.tok_decode(tokens[:limit]), until, None)
            for tokens, (_, until, limit) in zip(generated, jobs, strict=True)
        ]
