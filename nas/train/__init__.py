"""Training stages: global knowledge distillation of a child from its parent
(:mod:`~nas.train.distill`, torch, under torchrun), its memory and time plan before anything
loads (:mod:`~nas.train.plan`, torch-free), and the iterative search -> distill -> rescore
loop (:mod:`~nas.train.iterate`). Importing this package loads no torch."""
