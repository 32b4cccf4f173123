"""The recipe's parameter groups: what decays, with and without ``model.optimizer.decay_input``."""

from argparse import ArgumentError

import pytest
import torch
from jsonargparse import ArgumentParser

from fixed_embed.errors import CheckpointError
from fixed_embed.interfaces import GF2CodeInput, LearnedInput, LowRankLearnedInput
from fixed_embed.model.recipe import (
    AdamWConfig,
    build_adamw,
    parameter_groups,
    parameter_groups_change,
)
from fixed_embed.train.module import LanguageModel

DECODER = {
    "vocab_size": 300,
    "d_model": 32,
    "n_layers": 2,
    "n_heads": 4,
    "ffn_dim": 64,
    "max_seq_len": 16,
}


def _model(interface, **optimizer):
    return LanguageModel(decoder=DECODER, interface=interface, optimizer=optimizer or None)


def _ids(params):
    return {id(p) for p in params}


@pytest.mark.parametrize("decay_input", [True, False])
@pytest.mark.parametrize("interface", [LearnedInput, LowRankLearnedInput])
def test_learned_input_table_decays_only_with_decay_input(interface, decay_input):
    model = _model(interface, decay_input=decay_input)
    decay, no_decay = build_adamw(model, model.optimizer_config).param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    table = model.interface.weight
    assert id(table) in _ids(decay["params"] if decay_input else no_decay["params"])
    assert id(table) not in _ids(no_decay["params"] if decay_input else decay["params"])
    # the rest of the model does not depend on the option: block and head matrices decay, norm
    # gains never
    others = [p for p in model.parameters() if p is not table]
    assert {id(p) for p in others if p.dim() >= 2} <= _ids(decay["params"])
    assert {id(p) for p in others if p.dim() == 1} <= _ids(no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_default_decays_the_learned_table_as_before():
    assert AdamWConfig().decay_input is True
    model = _model(LearnedInput)
    decay, _ = parameter_groups(model, 0.1)
    assert id(model.interface.weight) in _ids(decay["params"])


def test_fixed_codes_give_the_same_groups_either_way():
    model = _model(GF2CodeInput)
    with_decay = [_ids(g["params"]) for g in parameter_groups(model, 0.1, decay_input=True)]
    without = [_ids(g["params"]) for g in parameter_groups(model, 0.1, decay_input=False)]
    assert with_decay == without


def test_decay_input_is_in_the_config_schema_and_the_hyper_parameters():
    parser = ArgumentParser()
    parser.add_class_arguments(LanguageModel, "model")
    config = parser.parse_args(["--model.optimizer.decay_input=false"])
    assert config.model.optimizer.decay_input is False
    with pytest.raises(SystemExit):  # the schema's bool refuses it while parsing
        parser.parse_args(["--model.optimizer.decay_input=maybe"])
    model = _model(LearnedInput, decay_input=False)
    assert model.hparams["optimizer"]["decay_input"] is False
    rebuilt = LanguageModel(**model.hparams)
    assert rebuilt.optimizer_config.decay_input is False


def test_a_resume_that_moves_the_table_between_groups_is_refused():
    learned = _model(LearnedInput, decay_input=False)
    why = parameter_groups_change({"decay_input": True}, learned.optimizer_config, learned)
    assert why and "decay_input is True in the checkpoint and False now" in why
    # a checkpoint from before the option decayed the table
    assert parameter_groups_change({"lr": 1e-3}, learned.optimizer_config, learned) == why
    assert (
        parameter_groups_change({"decay_input": False}, learned.optimizer_config, learned) is None
    )
    fixed = _model(GF2CodeInput, decay_input=False)
    assert parameter_groups_change({"decay_input": True}, fixed.optimizer_config, fixed) is None


def test_on_load_checkpoint_refuses_the_change_only_when_fitting():
    model = _model(LearnedInput, decay_input=False)

    class Trainer:
        class state:
            fn = "fit"

    model._trainer = Trainer()
    saved = {**model.hparams, "optimizer": {**model.hparams["optimizer"], "decay_input": True}}
    with pytest.raises(CheckpointError, match="decay_input"):
        model.on_load_checkpoint({"hyper_parameters": saved})
    Trainer.state.fn = "validate"  # no optimizer state is loaded: nothing to refuse
    model.on_load_checkpoint({"hyper_parameters": saved})


def test_decay_shrinks_only_what_is_in_the_decay_group():
    torch.manual_seed(0)
    for decay_input in (True, False):
        model = _model(
            LearnedInput,
            lr=1e-2,
            weight_decay=0.5,
            decay_input=decay_input,
            implementation="for-loop",
        )
        optimizer = build_adamw(model, model.optimizer_config)
        before = model.interface.weight.detach().clone()
        # no gradient: only the decay moves it
        model.interface.weight.grad = torch.zeros_like(before)
        optimizer.step()
        after = model.interface.weight.detach()
        if decay_input:
            assert torch.allclose(after, before * (1 - 1e-2 * 0.5))
        else:
            assert torch.equal(after, before)


@pytest.mark.parametrize("decay_input", [True, False])
def test_an_input_lr_scale_gives_the_table_its_own_group_and_rate(decay_input):
    model = _model(LowRankLearnedInput, lr=1e-3, input_lr_scale=10.0, decay_input=decay_input)
    optimizer = build_adamw(model, model.optimizer_config)
    decay, no_decay, inputs = optimizer.param_groups
    assert _ids(inputs["params"]) == {id(model.interface.weight)} and inputs["lr"] == pytest.approx(
        1e-2
    )
    assert inputs["weight_decay"] == (0.1 if decay_input else 0.0) and decay["lr"] == pytest.approx(
        1e-3
    )
    assert id(model.interface.weight) not in _ids(decay["params"]) | _ids(no_decay["params"])
    fixed = _model(GF2CodeInput, input_lr_scale=10.0)  # nothing trainable in the input: two groups
    assert len(build_adamw(fixed, fixed.optimizer_config).param_groups) == 2


def test_a_resume_between_one_and_another_input_lr_scale_is_refused():
    model = _model(LearnedInput, input_lr_scale=10.0)
    why = parameter_groups_change({"lr": 1e-3}, model.optimizer_config, model)
    assert why and "input_lr_scale is 1.0 in the checkpoint and 10.0 now" in why
    assert parameter_groups_change({"input_lr_scale": 3.0}, model.optimizer_config, model) is None
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(AdamWConfig, "optimizer")
    with pytest.raises(ArgumentError, match=r'"optimizer.input_lr_scale"(.|\n)*0 does not conform'):
        parser.parse_args(["--optimizer.input_lr_scale=0"])
