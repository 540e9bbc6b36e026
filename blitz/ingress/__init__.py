"""The ingress's request logic, free of Ray and of HTTP: the request pipeline and output
options (``service``), the request limits' checks (``limits``), which pool serves a
request (``routing``) and why a pool replica waits for the cluster (``placement``).

May import every floor below it (``blitz.pool``, ``blitz.bulk``, ``blitz.hop_messages``,
``blitz.loading``, ``blitz.encoders``, ``blitz.settings``, ``blitz.sources``,
``blitz.runtime``) and the top-level leaf modules; never ``blitz.http``.
"""
