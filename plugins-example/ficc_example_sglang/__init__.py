"""An example third-party FICC Inference engine adapter for SGLang."""

from .adapter import SGLangAdapter, TranslationError

__all__ = ["SGLangAdapter", "TranslationError"]
