"""Real data: a digits vision transformer (``vit``) and a probe of pretrained transformers
(``probe``). Heavy modules (torch, transformers) load only when a submodule is imported."""
