"""Block decoders, one module per algorithm, behind one small interface (:class:`base.BlockDecoder`).

* ``low_confidence`` — threshold commit with top-1 fallback (SGLang LowConfidence, engine_spec.md §6.4);
* ``joint_threshold`` — LLaDA2.1 M2T + T2T editing (engine_spec.md §6.2, §6.5, LLaDA2.1 report Eqs. 1–3);
* ``orl`` — joint threshold + ORL self-conditioning residual (engine_spec.md §7–§8, issue 5).

:func:`make_decoder` builds one from a :class:`DecoderConfig` (or the interface dict of docs/interfaces.md).
"""

from repro.engine.decoders.base import BlockDecoder, DecoderConfig, DecoderConfigError


def make_decoder(cfg, mask_id: int) -> BlockDecoder:
    """Decoder instance for ``cfg`` (:class:`DecoderConfig` or dict); raises DecoderConfigError if unknown."""
    from repro.engine.decoders import joint_threshold, low_confidence, orl

    cfg = DecoderConfig.coerce(cfg)
    cls = {"low_confidence": low_confidence.LowConfidence, "joint_threshold": joint_threshold.JointThreshold,
           "orl": orl.ORLDecoder}[cfg.algorithm]
    return cls(cfg, mask_id)


__all__ = ["BlockDecoder", "DecoderConfig", "DecoderConfigError", "make_decoder"]
