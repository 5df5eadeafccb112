// MdevCounterPlan: the KEP-4815 numbers for one partitionable parent (a GPU or another parent of
// mdev types): the value of its one counter, what its whole-device entry consumes, what one
// potential instance of each type consumes, and how many potential instances of each type may be
// offered. docs/counter-sets.md has the model and the proof sketch; in short:
//
//  Maxima model (used whenever it agrees with the kernel): L = lcm(max_t); capacity = L minus
//  L / max_type for every instance that exists; a potential instance of t consumes L / max_t; the
//  whole device consumes L. With exact maxima (MdevTypeMaxima) and a kernel that counts space,
//  the capacity is exactly what is free, so everything the kernel can still create fits.
//
//  Availability model (only when the maxima are lower bounds that would leave some of what the
//  kernel says can be created unallocatable): C = lcm(available_t); capacity C; a potential
//  instance of t consumes C / available_t; the whole device consumes C, or C + 1 while
//  instances exist. Any allocation it admits satisfies sum(n_t / available_t) <= 1, which a kernel
//  that counts space can create.
//
// Invariants of both: the whole device and any instance (potential or existing) never fit
// together; no type is offered more potential instances than its available_instances (so a parent
// that runs one type at a time offers only the type in use once an instance exists); every type
// with available_instances > 0 can have at least one instance allocated.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "discovery/inventory.h"
#include "slicepublisher/mdev_type_maxima.h"

namespace vfio_dra::slicepublisher {

struct MdevTypeCounters {
  int names = 0;         // instance names (and UUIDs) 0..names-1 exist for the type: max_t
  int offerable = 0;     // potential instances that may be published now: available_instances
  int64_t consumes = 0;  // what one potential instance consumes
};

struct MdevCounterPlan {
  int64_t capacity = 0;
  int64_t whole_consumes = 0;
  std::map<std::string, MdevTypeCounters> types;  // by type id
  bool availability_model = false;
  // Set when the numbers could not be made (instance counts without a common multiple in range):
  // then nothing but the whole device and existing instances may be offered.
  std::string problem;
};

MdevCounterPlan PlanMdevCounters(const discovery::MdevParent& parent, const MdevTypeMaxima& maxima);

}  // namespace vfio_dra::slicepublisher
