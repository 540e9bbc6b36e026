"""The process a model runs in: intra-op threads (``model_threads``), child processes that
die with their parent (``child_process``), what the CPU does fast (``cpu_features``), CUDA
memory (``gpu_memory``), imports kept out of a replica (``lean_imports``), metric values
recorded off the event loop (``metric_buffer``), OpenTelemetry traces (``tracing``),
glibc's trim (``malloc``), Python's collector tuned for serving (``collector``) and a
stop's drain (``draining``)."""
