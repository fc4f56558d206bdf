// What a job trains on and what it trains, as its flags name them: the workers' loop
// (train.h) and the parameter servers (ps_server.h) both start from these, so each rank and
// server holds the same data and sizes the same model.
#pragma once

#include "trainer/config.h"
#include "trainer/data.h"
#include "trainer/model.h"

namespace dlrun::trainer {

// The data --data-dir (or --synthetic) names: every rank and parameter server loads the same.
Split loadData(const TrainConfig& config);

// The model --model names, sized for the data: --hidden for the MLP; the CNN takes 28x28
// images (Error otherwise).
ModelSpec modelSpec(const TrainConfig& config, const Dataset& data);

}  // namespace dlrun::trainer
