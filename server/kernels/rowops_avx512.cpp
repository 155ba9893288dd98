#include "rowops_impl.h"
#include "rowops_table.h"

ROWOPS_TABLE(avx512)
