#define ROWOPS_AMX 1
#include "rowops_impl.h"
#include "rowops_table.h"

ROWOPS_TABLE(amx)
