"""The driver's runtime shell: the threads and I/O around the pure job (:mod:`cloud_elastic.driver.job`)."""
