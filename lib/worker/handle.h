// Handle is part of the public trainer API: mercury/handle.h.
#pragma once

#include "mercury/handle.h"
