"""Reading a model's activations: the activation cache and its decompositions, patching,
interventions, metrics, head detection and inspection.

These work on any hooked model through its hook points and forward; they never import a
model class, so the models can return an `ActivationCache` without a cycle.
"""
