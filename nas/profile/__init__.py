"""Profiling real blocks on a device, the torch side: :mod:`nas.profile.blocks` builds each
distinct block of a search's space as the real torch module (:class:`nas.modules.Block`)
and times its prefill and decode points on the device, with their peak memory, what
``puzzle-nas profile --blocks`` runs. The tables it writes are read, without torch, by
``costmodels.measured``; the device's own figures (peaks, bandwidth, efficiencies) are
probed by ``hwprofiles.probe``.
"""
