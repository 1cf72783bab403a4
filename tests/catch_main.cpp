// main() for Catch2 v2 test programs (v3 links Catch2WithMain instead).
#define CATCH_CONFIG_MAIN
#include "tests/catch.h"
