"""Where a model's parts live in one process: device maps, CPU and disk offload, with HF accelerate.

`plan` decides the device of each part; `dispatch` attaches accelerate's hooks and reads
offloaded weights. Placement over several processes is `hooked.scale`.
"""
