"""streamfed: online streaming federated learning over MQTT.

Importing it limits BLAS to one thread per process (`STREAMFED_BLAS_THREADS`, see
:mod:`streamfed.blas_threads`) before numpy loads where it can: the algebra here is small, and BLAS threads only
contend on a busy machine.
"""

from streamfed.blas_threads import limit_blas_threads as _limit_blas_threads

_limit_blas_threads()
