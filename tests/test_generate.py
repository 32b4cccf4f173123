"""`fixed-embed generate`: greedy is the argmax of the model's logits step by step, for every
paper interface; a seed reproduces a sample; a prompt longer than the context is cropped to it."""

from pathlib import Path

import pytest
import torch

from fixed_embed.interfaces import BinaryCodeInput, GF2CodeInput, LearnedInput
from fixed_embed.model.decoder import Decoder, DecoderConfig
from tests.cli import run_cli
from tests.helpers import TINY_DECODER

# tiny binary16, V 512
CHECKPOINT = Path(__file__).parent / "fixtures" / "main-1c25064" / "step=00000002.ckpt"


def tiny(interface) -> Decoder:
    torch.manual_seed(0)
    config = DecoderConfig(**{**TINY_DECODER, "max_seq_len": 8})
    return Decoder(config, interface(config.vocab_size, config.d_model)).eval()


@pytest.mark.parametrize("interface", [LearnedInput, BinaryCodeInput, GF2CodeInput])
def test_greedy_is_the_argmax_of_the_logits_step_by_step_and_crops_a_long_prompt(interface):
    decoder, prompt = tiny(interface), torch.arange(1, 13).unsqueeze(0)  # 12 ids, context 8
    out = decoder.generate(prompt, 6, temperature=0)
    assert out.shape == (1, 18) and torch.equal(out[:, :12], prompt)
    ids = prompt
    with torch.no_grad():
        for _ in range(6):
            ids = torch.cat([ids, decoder(ids[:, -8:])[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, ids)
    assert torch.equal(decoder.generate(prompt, 6, temperature=0), out)


def test_a_seeded_sample_is_reproducible_and_top_k_and_vocab_bound_the_draw():
    decoder, prompt = tiny(GF2CodeInput), torch.tensor([[5, 6, 7]])

    def draw(seed, **kw):
        return decoder.generate(
            prompt, 20, 1.0, generator=torch.Generator().manual_seed(seed), **kw
        )

    assert torch.equal(draw(1), draw(1)) and not torch.equal(draw(1), draw(2))
    with torch.no_grad():
        top = decoder(prompt)[:, -1].topk(3).indices[0].tolist()
    assert all(draw(seed, top_k=3)[0, 3].item() in top for seed in range(5))
    assert draw(3, vocab=50)[0, 3:].max() < 50


def test_the_command_continues_a_prompt_greedily_and_refuses_an_empty_one():
    greedy = [
        run_cli(
            "generate",
            CHECKPOINT,
            "--prompt",
            "The",
            "--max-new-tokens",
            "5",
            "--temperature",
            "0",
            "--device",
            "cpu",
        )
        for _ in range(2)
    ]
    assert greedy[0].returncode == 0, greedy[0].stderr[-2000:]
    assert greedy[0].stdout == greedy[1].stdout and greedy[0].stdout.endswith("\n")
    sampled = [
        run_cli("generate", CHECKPOINT, "--prompt", "The", "--seed", "3", "--device", "cpu")
        for _ in range(2)
    ]
    assert sampled[0].returncode == 0 and sampled[0].stdout == sampled[1].stdout
    empty = run_cli("generate", CHECKPOINT, "--prompt", "", "--device", "cpu")
    assert empty.returncode == 2 and "--prompt holds no text" in empty.stderr


def test_help_texts_show_no_docstring_markup():
    result = run_cli("generate", "--help")
    assert result.returncode == 0 and "fixed_embed.model.decoder.Decoder.generate" in result.stdout
    assert "``" not in result.stdout and ":meth:" not in result.stdout
    params = run_cli("params", "--help")
    assert (
        ":func:" not in params.stdout
        and "``" not in params.stdout
        and "memory_estimate" in params.stdout
    )
