"""The hooked model classes, each assembled from components and mixins (one concern per mixin file).

`HookedTransformer` (decoders), `HookedEncoder` and `BertNextSentencePrediction` (BERT),
`HookedEncoderDecoder` (T5) and `HookedAudioEncoder` (HuBERT).
"""
