"""Knowing the machine: probes, CPUID and feature decoding, pasted dumps, the
microarchitecture, system and toolchain facts, the evidence and the machine report."""
