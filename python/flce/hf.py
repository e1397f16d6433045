"""flce.hf — a Hugging Face causal LM's training loss through flce.

    model = AutoModelForCausalLM.from_pretrained(...)
    flce.patch_hf(model)              # this model instance only; returns it
    out = model(input_ids, labels=labels)   # out.loss from flce, out.logits is None

When `labels` are given in training mode (and logits_to_keep is 0, the default), the patched forward runs the
decoder (model.model) for the last hidden states and computes the loss with
flce.linear_cross_entropy on lm_head's weight (and bias), exactly as the model's own loss
(transformers' ForCausalLMLoss) defines it:
  - labels are shifted (position t predicts labels[t + 1], the last position predicts nothing),
    or `shift_labels` is used as given; ignore_index -100 unless passed;
  - `num_items_in_batch` (the Trainer's gradient-accumulation count): the summed loss divided by
    it; without it, the mean over non-ignored tokens;
  - Gemma 2/3: config.final_logit_softcapping becomes flce's softcap.
The logits are never made: out.logits is None. Without labels (generation, scoring with logits),
and by default in eval mode (evaluation with metrics needs the logits), the model's own forward
runs unchanged.

Model families checked against the unpatched model (python/test_hf.py): Llama, Mistral, Qwen2,
Qwen3, Gemma, Gemma 2 and Gemma 3 (text, Gemma3ForCausalLM). Others are refused unless
allow_unknown=True (a model that scales or post-processes its logits in other ways would get a
different loss). flce.unpatch_hf(model) restores the original forward.
"""
import functools
import inspect
import types

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from . import _compat, linear_cross_entropy

__all__ = ["patch_hf", "unpatch_hf"]

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text")
_LOSS_KWARGS = ("num_items_in_batch", "shift_labels", "ignore_index")
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _base_model(model):
    base = getattr(model, "model", None)
    if base is None:
        base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    if base is None:
        raise ValueError(f"{type(model).__name__}: no decoder module (model.model) to run for the hidden states")
    return base


def patch_hf(model, *, strategy="auto", memory_budget=None, allow_unknown=False, eval_logits=True):
    """Routes `model`'s loss through flce when labels are given (see the module doc). strategy and
    memory_budget go to flce.linear_cross_entropy. eval_logits (default True): in eval mode
    (model.training False) a call with labels still runs the model's own forward, logits and all,
    since evaluation with metrics (the Trainer's prediction_step) needs the logits, as Liger does;
    False sends eval losses through flce too. Returns the model. Patching twice is a no-op."""
    if getattr(model, "_flce_original_forward", None) is not None:
        return model
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES and not allow_unknown:
        raise ValueError(f"patch_hf: model_type {model_type!r} has not been checked against flce (checked: "
                         f"{', '.join(FAMILIES)}); pass allow_unknown=True if its logits are lm_head(hidden) "
                         f"with nothing applied after them but an optional final_logit_softcapping")
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise ValueError(f"patch_hf: the output layer is {type(head).__name__}, not a torch.nn.Linear")
    _base_model(model)
    orig = model.forward
    names = [p.name for p in inspect.signature(orig).parameters.values() if p.kind in _POSITIONAL]
    options = {"strategy": strategy, "memory_budget": memory_budget}

    def forward(self, *args, **kwargs):
        original = self._flce_original_forward
        if len(args) > len(names) or any(n in kwargs for n in names[:len(args)]):
            return original(*args, **kwargs)  # let the model report the bad call
        call = dict(zip(names, args))
        call.update(kwargs)
        if call.get("labels") is None or (eval_logits and not self.training):
            return original(*args, **kwargs)
        keep = call.get("logits_to_keep", call.get("num_logits_to_keep", 0))
        if not (isinstance(keep, int) and keep == 0):
            return original(*args, **kwargs)
        return _loss_forward(self, call, options)

    func = getattr(orig, "__func__", None)
    if func is not None and getattr(orig, "__self__", None) is model:
        # a method of the model: bound to it, so copy.deepcopy(model) gets a forward of the copy;
        # __wrapped__ is the unbound function, so inspect.signature(model.forward) is the model's
        # (the Trainer looks there for **kwargs before passing num_items_in_batch)
        functools.update_wrapper(forward, func)
        model.forward = types.MethodType(forward, model)
    else:
        plain = functools.wraps(orig)(lambda *a, **k: forward(model, *a, **k))
        model.forward = plain
    model._flce_original_forward = orig
    return model


def unpatch_hf(model):
    """Restores the forward patch_hf replaced. Returns the model."""
    orig = getattr(model, "_flce_original_forward", None)
    if orig is not None:
        if getattr(orig, "__self__", None) is model and getattr(orig, "__func__", None) is type(model).forward:
            del model.forward  # the class's own method again
        else:
            model.forward = orig
        del model._flce_original_forward
    return model


def _loss_forward(model, call, options):
    labels = call.pop("labels")
    loss_kw = {k: call.pop(k) for k in _LOSS_KWARGS if k in call}
    for k in ("logits_to_keep", "num_logits_to_keep"):
        call.pop(k, None)
    return_dict = call.pop("return_dict", None)
    outputs = _base_model(model)(**call)
    hidden = outputs[0]
    head = model.get_output_embeddings()
    weight, bias = head.weight, head.bias
    if hidden.dtype != weight.dtype and _compat.autocast_dtype(hidden.device.type) is None:
        hidden = hidden.to(weight.dtype)  # (under autocast linear_cross_entropy casts both to its dtype)
    ignore_index = loss_kw.get("ignore_index", -100)
    shift_labels = loss_kw.get("shift_labels")
    if shift_labels is not None:
        targets, shift = shift_labels.to(hidden.device), 0
    else:
        targets, shift = labels.to(hidden.device), 1
    num_items = loss_kw.get("num_items_in_batch")
    softcap = getattr(model.config, "final_logit_softcapping", None) or 0.0
    loss = linear_cross_entropy(hidden.contiguous(), weight, targets.contiguous(), bias=bias,
                                ignore_index=ignore_index, reduction="mean" if num_items is None else "sum",
                                softcap=softcap, shift=shift, **options)
    if num_items is not None:
        if torch.is_tensor(num_items):
            num_items = num_items.to(loss.device)
        loss = loss / num_items
    out = CausalLMOutputWithPast(loss=loss, logits=None,
                                 past_key_values=getattr(outputs, "past_key_values", None),
                                 hidden_states=getattr(outputs, "hidden_states", None),
                                 attentions=getattr(outputs, "attentions", None))
    return out if return_dict is None or return_dict else out.to_tuple()
