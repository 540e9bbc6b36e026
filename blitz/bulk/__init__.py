"""The bulk embedding job's Ray-free half (``deployments/bulk.py`` runs it on Ray Data):
the batch step (``job``), the readers (``read``, CSV rows cut by ``csv_split``; image files,
lists and tables of image paths by ``images``), what OUTPUT holds and what a run may do to
it (``units``), a job planned, checked and run unit by unit (``plan``), and writing a unit
(``write``), published whole and in order as the stream passes it (``publish``)."""
