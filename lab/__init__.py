"""The lab every kata, check and trainer imports: a tiny LM with the contract's interface and toy tasks."""
from lab.model import KVCache, ModelConfig, TinyLM
from lab.tasks import EOS, PAD, VOCAB_SIZE, CopyTask, SumTask, decode, encode, left_pad, make_task

__all__ = ["KVCache", "ModelConfig", "TinyLM", "EOS", "PAD", "VOCAB_SIZE", "CopyTask", "SumTask",
           "decode", "encode", "left_pad", "make_task"]
