"""Block decoders, one module per algorithm, behind one small interface (:class:`base.BlockDecoder`).

* ``low_confidence`` — threshold commit with top-1 fallback (SGLang ``LowConfidence``);
* ``joint_threshold`` — LLaDA2.1 M2T + T2T editing (LLaDA2.1 reference generate, report Eqs. 1–3; SGLang
  ``JointThreshold``);
* ``orl`` — joint threshold + ORL self-conditioning residual (ORL model card; RCD/ORL papers).

Registry: each module defines ``Decoder`` (its class, with ``name``) and ``DEFAULTS`` (its settings'
defaults) and is found by name (:func:`base.algorithms`, as SGLang's ``dllm/algorithm/__init__.py``); a new
algorithm is one new module here. :func:`make_decoder` builds one from a :class:`DecoderConfig` (or the
interface dict of docs/interfaces.md). :mod:`.device` is the greedy step of all of them as one on-device
operation, built from the same helpers.
"""

from repro.engine.decoders.base import (BlockDecoder, DecoderConfig, DecoderConfigError, algorithm_defaults,
                                        algorithms)


def make_decoder(cfg, mask_id: int) -> BlockDecoder:
    """Decoder instance for ``cfg`` (:class:`DecoderConfig` or dict); raises DecoderConfigError if unknown."""
    cfg = DecoderConfig.coerce(cfg)
    return algorithms()[cfg.algorithm].Decoder(cfg, mask_id)


__all__ = ["BlockDecoder", "DecoderConfig", "DecoderConfigError", "algorithm_defaults", "algorithms",
           "make_decoder"]
