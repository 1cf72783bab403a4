// Result rows appended to a CSV file that many runs may share (benchmarks, sweeps, comm_bench).
#pragma once

#include <string>

namespace trainer {

// Refuses (UsageError) a path that is not a regular file, or a file whose first line is another
// header than `header` (written by another version or another tool).
void check_csv_header(const std::string& path, const std::string& header);

// Appends one row (ending in "\n"), writing `header` first into an empty file. Several runs may
// append to one CSV at once (the tasks of a Slurm job array, on several hosts of a shared file
// system): the row goes in one write() under an exclusive lock, so none is lost, torn or
// headerless.
void append_csv_row(const std::string& path, const std::string& header, const std::string& row);

// The NCCL settings of the environment that change what a measurement means, as
// "NAME=value NAME=value" (quoted when a value holds a comma), "" when none is set.
std::string nccl_env_field();

}  // namespace trainer
